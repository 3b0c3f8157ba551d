// NSQ consumer flags (go-nsq's names) shared by `tail` and the later `consume`, and their conversion to
// an nsq::consumer_config with validation that names the flag at fault.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nsq/config.hpp"

namespace cg::app {

// TLS, compression and AUTH towards nsqd (consume, tail, publish).
struct nsq_security_flags {
    bool tls = false;
    std::string tls_ca_file, tls_cert_file, tls_key_file, tls_server_name;
    bool snappy = false, deflate = false;
    int deflate_level = 6;
    std::string auth_secret_file;  // else CHARGEGUARD_NSQ_AUTH_SECRET
};

// Adds --nsq-tls, --nsq-tls-ca-file, --nsq-tls-cert, --nsq-tls-key, --nsq-tls-server-name, --nsq-snappy,
// --nsq-deflate, --nsq-deflate-level, --nsq-auth-secret-file.
void add_nsq_security_flags(CLI::App& cmd, nsq_security_flags& f);
// Converts and validates (at most one compression …); reads the AUTH secret from the file or from
// `env_secret` (CHARGEGUARD_NSQ_AUTH_SECRET). Throws CLI::ValidationError naming the flag.
nsq::nsq_security to_nsq_security(const nsq_security_flags& f, const char* env_secret);

struct nsq_consumer_flags {
    std::string topic;
    std::string channel;
    std::vector<std::string> nsqd_tcp_addresses;
    std::vector<std::string> lookupd_http_addresses;
    unsigned max_in_flight = 200;
    std::string msg_timeout = "0";  // 0: nsqd's --msg-timeout
    std::string heartbeat_interval = "30s";
    unsigned max_attempts = 5;  // 0: unlimited
    std::string lookupd_poll_interval = "60s";
    nsq_security_flags security;
};

// Adds --topic, --channel, --nsqd-tcp-address (repeatable), --lookupd-http-address (repeatable),
// --max-in-flight, --msg-timeout, --heartbeat-interval, --max-attempts, --lookupd-poll-interval, and the
// security flags (add_nsq_security_flags).
void add_nsq_consumer_flags(CLI::App& cmd, nsq_consumer_flags& f, bool channel_required);

// Go-style durations: "1500ms", "60s", "1m30s", "2h"; "0" alone is zero. nullopt when malformed.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view s);
// parse_duration for a flag's value; throws CLI::ValidationError naming the flag when malformed.
std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& value);

// Converts and validates; throws CLI::ValidationError naming the flag and the accepted range, e.g.
// "--msg-timeout: 500ms is out of range: 0 (nsqd's default) or 1s .. 15m (nsqd's max-msg-timeout)".
nsq::consumer_config to_consumer_config(const nsq_consumer_flags& f);

}  // namespace cg::app
