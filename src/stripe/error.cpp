#include "stripe/error.hpp"

#include "core/error.hpp"

namespace cg::stripe {
namespace {
const char* describe(int v) noexcept {
    switch (static_cast<errc>(v)) {
        case errc::ok:
            return "ok";
        case errc::declined:
            return "declined";
        case errc::cap_exceeded:
            return "spend cap exceeded";
        case errc::idempotency_conflict:
            return "idempotency key reused with different parameters";
        case errc::retry_same_key:
            return "temporarily refused; retry with the same idempotency key";
        case errc::indeterminate:
            return "outcome unknown (server error, timeout or disconnect after sending)";
        case errc::rejected:
            return "rejected by Stripe";
        case errc::setup_error:
            return "refused for the client's setup (API key, permissions, address)";
        case errc::bad_response:
            return "unexpected response body";
        case errc::bad_config:
            return "bad Stripe configuration";
    }
    return "unknown stripe error";
}
}  // namespace

const std::error_category& category() noexcept {
    static const simple_category cat("chargeguard.stripe", describe);
    return cat;
}

}  // namespace cg::stripe
