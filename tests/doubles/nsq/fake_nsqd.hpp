// fake-nsqd: an in-process nsqd 1.3.0 double built on nsq/proto, at least as strict as the real one
// (same error frames, byte for byte, same fatal/non-fatal split, RDY and IDENTIFY bounds, heartbeats,
// msg_timeout, TOUCH cap, AUTH before SUB/PUB) plus test controls (drop connections, restart, latency,
// a slow auth server, RDY assertions). No TLS or compression.
// Runs on one executor; every method must be called on it.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/address.hpp"
#include "nsq/proto/lookup.hpp"

namespace cg::test::nsq {

using std::chrono::milliseconds;

// Sum of RDY over clients, shared by several fake nsqds so a test can assert a consumer's total across
// servers. Updated on every RDY, CLS and disconnect.
struct rdy_ledger {
    std::int64_t limit = 0;  // 0: only record the peak
    std::int64_t total = 0;
    std::int64_t peak = 0;
    std::uint64_t violations = 0;
    std::map<const void*, std::int64_t> per_client;
    void set(const void* client, std::int64_t rdy);
    void remove(const void* client) { set(client, 0), per_client.erase(client); }
};

// What the auth server says about one secret (fake_nsqd_options::auth_secrets).
struct fake_auth_identity {
    std::string identity;
    std::string identity_url;
    std::int64_t permission_count = 1;  // 0: nsqd's E_UNAUTHORIZED "AUTH no authorizations found"
};

struct fake_nsqd_options {
    std::int64_t max_rdy_count = 2500;
    milliseconds msg_timeout{60000};
    milliseconds max_msg_timeout{15 * 60 * 1000};
    milliseconds max_req_timeout{60 * 60 * 1000};
    milliseconds heartbeat_interval{30000};
    milliseconds max_heartbeat_interval{60000};
    std::int64_t max_msg_size = 1024 * 1024;
    std::int64_t max_body_size = 5 * 1024 * 1024;
    milliseconds queue_scan_interval{50};
    std::string version = "1.3.0";
    std::string broadcast_address = "127.0.0.1";
    std::string hostname = "fake-nsqd";
    // nsqd leaves a dropped client's in-flight messages to time out; the spec page says they are
    // requeued. false = nsqd's behaviour.
    bool requeue_on_disconnect = false;
    // Sum of RDY over one channel's clients above this counts as a violation (0: off).
    std::int64_t max_channel_rdy = 0;
    // AUTH, as nsqd started with --auth-http-address (empty: off, AUTH is E_AUTH_DISABLED): IDENTIFY says
    // auth_required; AUTH answers with the identity of a known secret (E_AUTH_FAILED otherwise) after
    // `auth_delay` — nsqd's own HTTP round trip to its auth server, during which its heartbeats go on and
    // it reads no command; SUB, PUB, MPUB and DPUB before a successful AUTH are E_AUTH_FIRST. Unlike
    // nsqd, a known secret may use every topic and channel (the double checks no authorizations).
    std::map<std::string, fake_auth_identity> auth_secrets;
    milliseconds auth_delay{0};
    std::shared_ptr<rdy_ledger> ledger;
};

struct channel_counts {
    std::int64_t depth = 0, in_flight = 0, deferred = 0;
    std::uint64_t message_count = 0, requeue_count = 0, timeout_count = 0, finish_count = 0;
    std::int64_t client_count = 0;
    bool paused = false;
};

class fake_nsqd {
  public:
    fake_nsqd(asio::any_io_executor ex, fake_nsqd_options opts = {}, logger log = {});
    ~fake_nsqd();
    fake_nsqd(const fake_nsqd&) = delete;
    fake_nsqd& operator=(const fake_nsqd&) = delete;

    // Listens for TCP (protocol V2) and HTTP (/ping, /pub, /mpub, /stats, pause/unpause …).
    result<void> start(const net::host_port& tcp = {"127.0.0.1", 0},
                       const net::host_port& http = {"127.0.0.1", 0});
    void stop();
    std::uint16_t tcp_port() const;
    std::uint16_t http_port() const;
    std::string tcp_address() const { return "127.0.0.1:" + std::to_string(tcp_port()); }
    cg::nsq::proto::producer_info producer() const;

    // --- test controls ---
    void publish(const std::string& topic, std::string body);
    void create_channel(const std::string& topic, const std::string& channel);
    void pause_channel(const std::string& topic, const std::string& channel, bool paused);
    void pause_topic(const std::string& topic, bool paused);
    // Closes every client connection (in-flight messages then behave as after a disconnect).
    void drop_all_connections();
    // As a restart: connections dropped, every in-flight message requeued (nsqd persists and reloads).
    void restart();
    // Delays every write to clients by this much.
    void set_latency(milliseconds d);
    // Stops answering (no heartbeats, no messages) without closing: a hung nsqd.
    void freeze(bool frozen);

    // --- observations ---
    channel_counts channel(const std::string& topic, const std::string& channel) const;
    std::uint64_t topic_message_count(const std::string& topic) const;
    std::size_t client_count() const;
    std::uint64_t total_connections() const;
    std::uint64_t heartbeat_disconnects() const;    // clients closed for 2 missed heartbeats
    std::vector<std::string> fatal_errors() const;  // every fatal error frame sent, in order
    std::uint64_t rdy_violations() const;
    std::int64_t peak_channel_rdy() const;
    // Every command line received (for tests that check the sequence, e.g. RDY 0 then RDY 1).
    std::vector<std::string> command_log() const;
    void record_commands(bool on);
    std::string stats_json(const std::string& topic = {}, const std::string& channel = {}) const;

    struct impl;

  private:
    std::shared_ptr<impl> impl_;
};

// fake-nsqlookupd: GET /lookup?topic= and /ping. Producers are registered by the test.
class fake_nsqlookupd {
  public:
    fake_nsqlookupd(asio::any_io_executor ex, logger log = {});
    ~fake_nsqlookupd();
    result<void> start(const net::host_port& http = {"127.0.0.1", 0});
    void stop();
    std::uint16_t http_port() const;
    std::string http_address() const { return "127.0.0.1:" + std::to_string(http_port()); }
    void add_producer(const std::string& topic, cg::nsq::proto::producer_info p);
    void remove_producer(const std::string& topic, const std::string& key);
    std::uint64_t lookups() const;

    struct impl;

  private:
    std::shared_ptr<impl> impl_;
};

}  // namespace cg::test::nsq
