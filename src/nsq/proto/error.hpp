// Errors of the NSQ module: codec failures, server error frames, connection outcomes, bad configuration.
#pragma once

#include <system_error>

namespace cg::nsq {

enum class errc {
    ok = 0,
    frame_too_large,    // a frame announced more bytes than the configured maximum
    bad_frame,          // size < 4 or an unknown frame type
    bad_message,        // a message frame too short or with an unusable id
    bad_response,       // an unexpected or unparsable response (IDENTIFY JSON, lookupd JSON)
    server_error,       // nsqd sent a fatal error frame (E_INVALID, E_BAD_BODY, …)
    bad_config,         // a consumer/producer setting out of the bounds nsqd accepts
    heartbeat_timeout,  // nothing read for 2 × heartbeat_interval
    connection_closed,  // the peer closed the connection
    unsupported,        // a feature nsqd asked for that we do not implement (AUTH, TLS, compression)
    timeout,            // connect / handshake / publish deadline passed
    shutting_down,      // refused because the component is stopping
    bad_name,           // topic or channel name outside [.a-zA-Z0-9_-]{1,64}(#ephemeral)?
    invalid_publish,    // a publish nsqd would refuse fatally: empty or oversized body, delay out of range
};

const std::error_category& category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), category()};
}

}  // namespace cg::nsq

template <>
struct std::is_error_code_enum<cg::nsq::errc> : std::true_type {};
