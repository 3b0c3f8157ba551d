// HTTP errors (parsing limits, transport outcomes the client reports).
#pragma once

#include <system_error>

namespace cg::http {

enum class errc {
    ok = 0,
    bad_message,        // malformed request/response (400 on the server side)
    header_too_large,   // request line + headers over the limit (431)
    body_too_large,     // body over the limit (413)
    unsupported,        // e.g. an Upgrade/CONNECT request
    connection_closed,  // peer closed before a complete message
    timeout,            // connect/request/response deadline passed
    pool_exhausted,     // client pool at its limit and the wait ran out
};

const std::error_category& category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), category()};
}

// The status a server answers for a parse error.
int status_for(errc e) noexcept;

}  // namespace cg::http

template <>
struct std::is_error_code_enum<cg::http::errc> : std::true_type {};
