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

struct nsq_consumer_flags {
    std::string topic;
    std::string channel;
    std::vector<std::string> nsqd_tcp_addresses;
    std::vector<std::string> lookupd_http_addresses;
    unsigned max_in_flight = 200;
    std::string msg_timeout = "0";            // 0: nsqd's --msg-timeout
    std::string heartbeat_interval = "30s";
    unsigned max_attempts = 5;                // 0: unlimited
    std::string lookupd_poll_interval = "60s";
};

// Adds --topic, --channel, --nsqd-tcp-address (repeatable), --lookupd-http-address (repeatable),
// --max-in-flight, --msg-timeout, --heartbeat-interval, --max-attempts, --lookupd-poll-interval.
void add_nsq_consumer_flags(CLI::App& cmd, nsq_consumer_flags& f, bool channel_required);

// Go-style durations: "1500ms", "60s", "1m30s", "2h"; "0" alone is zero. nullopt when malformed.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view s);
// parse_duration for a flag's value; throws CLI::ValidationError naming the flag when malformed.
std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& value);

// Converts and validates; throws CLI::ValidationError naming the flag and the accepted range, e.g.
// "--msg-timeout: 500ms is out of range: 0 (nsqd's default) or 1s .. 15m (nsqd's max-msg-timeout)".
nsq::consumer_config to_consumer_config(const nsq_consumer_flags& f);

}  // namespace cg::app
