// fake-nsq-auth: the HTTP auth server nsqd queries when started with --auth-http-address (nsqd 1.3.0
// internal/auth): GET /auth?remote_ip=&tls=&secret=&common_name= → 200 with
// {"ttl", "identity", "identity_url", "authorizations":[{"topic", "channels", "permissions"}]} for a known
// secret, 403 otherwise. Topic and channels are regular expressions; permissions "subscribe"/"publish".
// Runs on one executor; every method must be called on it.
#pragma once

#include <asio/any_io_executor.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/result.hpp"

namespace cg::test::nsq {

struct auth_grant {
    std::string topic;                     // regex
    std::vector<std::string> channels;     // regexes
    std::vector<std::string> permissions;  // "subscribe", "publish"
};

struct auth_identity {
    std::string identity;
    std::string identity_url;
    int ttl = 3600;  // seconds nsqd caches the answer
    std::vector<auth_grant> authorizations;
};

// One query as nsqd sent it.
struct auth_query {
    std::string remote_ip, tls, secret, common_name;
};

class fake_nsq_auth {
  public:
    explicit fake_nsq_auth(asio::any_io_executor ex);
    ~fake_nsq_auth();
    fake_nsq_auth(const fake_nsq_auth&) = delete;
    fake_nsq_auth& operator=(const fake_nsq_auth&) = delete;

    void add_secret(const std::string& secret, auth_identity id);
    result<void> start();  // 127.0.0.1, an ephemeral port
    void stop();
    std::uint16_t port() const;
    std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
    std::vector<auth_query> queries() const;

    struct impl;

  private:
    std::shared_ptr<impl> impl_;
};

// The JSON nsqd expects for `id`.
std::string to_json(const auth_identity& id);

}  // namespace cg::test::nsq
