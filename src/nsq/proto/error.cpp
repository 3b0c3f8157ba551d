#include "nsq/proto/error.hpp"

#include "core/error.hpp"

namespace cg::nsq {
namespace {

const char* describe(int v) noexcept {
    switch (static_cast<errc>(v)) {
        case errc::ok:
            return "ok";
        case errc::frame_too_large:
            return "frame larger than the maximum frame size";
        case errc::bad_frame:
            return "malformed frame";
        case errc::bad_message:
            return "malformed message frame";
        case errc::bad_response:
            return "unexpected response from nsqd/nsqlookupd";
        case errc::server_error:
            return "nsqd sent a fatal error";
        case errc::bad_config:
            return "invalid NSQ configuration";
        case errc::heartbeat_timeout:
            return "no data from nsqd for 2 heartbeat intervals";
        case errc::connection_closed:
            return "connection closed";
        case errc::unsupported:
            return "feature not supported";
        case errc::timeout:
            return "NSQ operation timed out";
        case errc::shutting_down:
            return "shutting down";
        case errc::bad_name:
            return "invalid topic or channel name";
        case errc::invalid_publish:
            return "publish refused before sending: nsqd would reject it";
    }
    return "unknown nsq error";
}

}  // namespace

const std::error_category& category() noexcept {
    static const simple_category cat("chargeguard.nsq", describe);
    return cat;
}

}  // namespace cg::nsq
