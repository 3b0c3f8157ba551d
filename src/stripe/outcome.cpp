#include "stripe/outcome.hpp"

#include "core/bytes.hpp"

namespace cg::stripe {

std::string_view to_string(outcome_class c) noexcept {
    switch (c) {
        case outcome_class::succeeded:
            return "succeeded";
        case outcome_class::declined:
            return "declined";
        case outcome_class::cap_exceeded:
            return "cap_exceeded";
        case outcome_class::idempotency_conflict:
            return "idempotency_conflict";
        case outcome_class::retry_same_key:
            return "retry_same_key";
        case outcome_class::indeterminate:
            return "indeterminate";
        case outcome_class::rejected:
            return "rejected";
    }
    return "unknown";
}

outcome_class classify_response(const response_facts& f) noexcept {
    if (f.status >= 200 && f.status < 300) return outcome_class::succeeded;
    // Stripe telling us the request did not take effect and may be sent again beats the status.
    if (f.should_retry == true) return outcome_class::retry_same_key;
    if (f.status == 402) {
        if (f.error_code == "spend_cap_exceeded") return outcome_class::cap_exceeded;
        return outcome_class::declined;
    }
    if (f.status == 400 && f.error_type == "idempotency_error") return outcome_class::idempotency_conflict;
    if (f.status == 409 || f.status == 429) return outcome_class::retry_same_key;
    // 424 (external dependency failed) and 5xx: Stripe may have executed and saved the request.
    if (f.status >= 500 || f.status == 424) return outcome_class::indeterminate;
    return outcome_class::rejected;
}

std::optional<bool> parse_should_retry(std::optional<std::string_view> header) noexcept {
    if (!header) return std::nullopt;
    if (iequals(*header, "true")) return true;
    if (iequals(*header, "false")) return false;
    return std::nullopt;
}

}  // namespace cg::stripe
