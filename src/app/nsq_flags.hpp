// NSQ consumer flags (go-nsq's names) shared by `tail` and the later `consume`, and their conversion to
// an nsq::consumer_config with validation that names the flag at fault.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/cli.hpp"
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
    bool max_in_flight_acknowledged = false;  // --max-in-flight-above-nsqd-default
    std::string msg_timeout = "60s";          // nsqd's own default, asked explicitly
    std::string heartbeat_interval = "30s";
    unsigned max_attempts = 5;  // 0: unlimited
    std::string lookupd_poll_interval = "60s";
    nsq_security_flags security;
};

// Adds --topic, --channel, --nsqd-tcp-address (repeatable), --lookupd-http-address (repeatable),
// --max-in-flight, --msg-timeout, --heartbeat-interval, --max-attempts, --lookupd-poll-interval, and the
// security flags (add_nsq_security_flags).
void add_nsq_consumer_flags(CLI::App& cmd, nsq_consumer_flags& f, bool channel_required);

// nsqd's default --max-rdy-count: a larger --max-in-flight needs --max-in-flight-above-nsqd-default.
inline constexpr unsigned max_rdy_count_default = 2500;

// Reads a secret file for `flag` (trailing whitespace trimmed). Throws config_error saying precisely what is
// wrong: missing, a directory, unreadable (permissions), empty. Never echoes the content.
std::string read_secret_file(const std::string& flag, const std::string& path);
[[noreturn]] void bad_secret_file(const std::string& flag, const std::string& path, const std::string& why);

// Converts and validates; throws usage_error/config_error naming the value and the accepted range, e.g.
// "--msg-timeout 500ms: out of range: 0 (nsqd's default) or 1s .. 15m (nsqd's max-msg-timeout)".
nsq::consumer_config to_consumer_config(const nsq_consumer_flags& f);

}  // namespace cg::app
