// The flags of a service's own HTTP listener (`proxy`, `webhooks`): how many clients at once, how long one
// has to send its request, and TLS; and the http::server_options they make.
#pragma once

#include <cstddef>
#include <string>

#include "app/cli.hpp"
#include "http/server.hpp"

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

}  // namespace cg::app
