// Network-layer errors that are not plain system errors.
#pragma once

#include <system_error>

namespace cg::net {

enum class errc {
    ok = 0,
    timeout,            // an operation outlived its deadline
    bad_address,        // "host:port" could not be parsed
    resolve_failed,     // DNS returned nothing usable
    tls_verify_failed,  // peer certificate rejected (chain or host name)
    tls_setup_failed,   // TLS context could not be built (CA file unreadable, …)
    shutting_down,      // refused because the component is stopping
};

const std::error_category& category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), category()};
}

}  // namespace cg::net

template <>
struct std::is_error_code_enum<cg::net::errc> : std::true_type {};
