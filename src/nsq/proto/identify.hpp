// IDENTIFY: the client's JSON, the negotiated response (simdjson), and the bounds nsqd enforces. Pure.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::nsq::proto {

// nsqd 1.3.0's bounds (options.go, client_v2.go).
inline constexpr std::int64_t min_heartbeat_interval_ms = 1000;
inline constexpr std::int64_t max_heartbeat_interval_ms = 60000;
inline constexpr std::int64_t min_msg_timeout_ms = 1000;
inline constexpr std::int64_t default_max_msg_timeout_ms = 15 * 60 * 1000;

struct identify_request {
    std::string client_id;
    std::string hostname;
    std::string user_agent;
    bool feature_negotiation = true;
    std::int64_t heartbeat_interval_ms = 30000;  // -1 disables (SUB is then refused), 0 = nsqd's default
    std::int64_t msg_timeout_ms = 0;             // 0 = nsqd's --msg-timeout
    // Fields the server side reads; a client leaves them at the defaults (not sent when zero/false).
    std::int64_t output_buffer_size = 0;
    std::int64_t output_buffer_timeout = 0;
    std::int64_t sample_rate = 0;
    bool tls_v1 = false, snappy = false, deflate = false;
    std::int64_t deflate_level = 0;
};

// Compact JSON with the fields nsqd reads; tls_v1/snappy/deflate only when requested.
std::string to_json(const identify_request& r);
// Go's json.Unmarshal semantics as nsqd applies them: unknown keys ignored, a wrong type fails.
result<identify_request> parse_identify_request(std::string_view json);

struct identify_response {
    std::int64_t max_rdy_count = 2500;
    std::string version;
    std::int64_t max_msg_timeout = default_max_msg_timeout_ms;  // ms
    std::int64_t msg_timeout = 60000;                           // ms, the effective value for this client
    bool tls_v1 = false;
    bool deflate = false;
    std::int64_t deflate_level = 6;
    std::int64_t max_deflate_level = 6;
    bool snappy = false;
    std::int64_t sample_rate = 0;
    bool auth_required = false;
    std::int64_t output_buffer_size = 16384;
    std::int64_t output_buffer_timeout = 250;
};

// Parses the feature-negotiation reply. "OK" (no negotiation) and malformed JSON are bad_response.
result<identify_response> parse_identify_response(std::string_view data);
// The reply as nsqd 1.3.0 writes it: compact, keys in nsqd's order (golden transcript).
std::string to_json(const identify_response& r);

// nsqd's answer to AUTH.
struct auth_response {
    std::string identity;
    std::string identity_url;
    std::int64_t permission_count = 0;
};
result<auth_response> parse_auth_response(std::string_view data);
std::string to_json(const auth_response& r);  // as nsqd writes it (fake-nsqd)

// The bounds IDENTIFY enforces, with nsqd's wording on failure ("msg timeout (N) is invalid").
result<void> check_heartbeat_interval(std::int64_t ms, std::int64_t max_ms = max_heartbeat_interval_ms);
result<void> check_msg_timeout(std::int64_t ms, std::int64_t max_ms = default_max_msg_timeout_ms);

}  // namespace cg::nsq::proto
