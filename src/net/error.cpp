#include "net/error.hpp"

#include "core/error.hpp"

namespace cg::net {
namespace {
const char* describe(int v) noexcept {
    switch (static_cast<errc>(v)) {
        case errc::ok:
            return "ok";
        case errc::timeout:
            return "timed out";
        case errc::bad_address:
            return "bad address (expected host:port)";
        case errc::resolve_failed:
            return "name resolution failed";
        case errc::tls_verify_failed:
            return "TLS certificate verification failed";
        case errc::tls_setup_failed:
            return "TLS setup failed";
        case errc::shutting_down:
            return "shutting down";
    }
    return "unknown net error";
}
}  // namespace

const std::error_category& category() noexcept {
    static const simple_category cat("chargeguard.net", describe);
    return cat;
}

}  // namespace cg::net
