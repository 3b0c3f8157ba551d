// The flags of a service's own HTTP listener (`proxy`, `webhooks`): how many clients at once, how long one
// has to send its request, and TLS; and the http::server_options they make.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "app/cli.hpp"
#include "app/pg_flags.hpp"
#include "http/server.hpp"
#include "net/address.hpp"
#include "pg/migrations.hpp"

namespace cg::app {

struct listener_flags {
    std::size_t max_connections = 1024;
    double read_timeout_s = 30;
    std::string tls_cert, tls_key;
};

// --max-connections, --read-timeout, --tls-cert, --tls-key.
void add_listener_flags(CLI::App& cmd, listener_flags& f);

// The listener's options. The handler answers bodies over `max_body_bytes` itself (a Stripe-shaped or counted
// 413); the parser's own limit (a plain 413) only stops what is far beyond it. TLS: the two files go together
// (usage_error) and OpenSSL must accept them (config_error).
http::server_options to_listener_options(const listener_flags& f, std::size_t max_body_bytes,
                                         std::string server_name);

// What a service with its own listener checks, after its own flags and before anything connects: --listen,
// the runtime flags and the migrations (each a CLI::ValidationError or usage_error naming the flag); then
// its logger.
struct listener_service_start {
    net::host_port listen;
    runtime_options opts;
    std::vector<pg::migration> migrations;
    logger log;
};
listener_service_start prepare_listener_service(const std::string& listen, const runtime_flags& rt,
                                                const pg_flags& pg, log_level level);

}  // namespace cg::app
