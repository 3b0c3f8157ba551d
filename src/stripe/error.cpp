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

errc errc_for(outcome_class c) noexcept {
    switch (c) {
        case outcome_class::succeeded:
            return errc::ok;
        case outcome_class::declined:
            return errc::declined;
        case outcome_class::cap_exceeded:
            return errc::cap_exceeded;
        case outcome_class::idempotency_conflict:
            return errc::idempotency_conflict;
        case outcome_class::retry_same_key:
            return errc::retry_same_key;
        case outcome_class::indeterminate:
            return errc::indeterminate;
        case outcome_class::rejected:
            return errc::rejected;
        case outcome_class::setup_error:
            return errc::setup_error;
    }
    return errc::indeterminate;
}

}  // namespace cg::stripe
