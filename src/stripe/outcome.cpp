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
        case outcome_class::setup_error:
            return "setup_error";
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
    if (f.status == 400 && f.error_type == "idempotency_error") {
        // The vault proxy's "this key is older than its same-key window" (it refused without forwarding):
        // not a payload conflict but a key Stripe may have forgotten, so search before a new generation.
        if (f.error_code == "idempotency_key_expired") return outcome_class::indeterminate;
        return outcome_class::idempotency_conflict;
    }
    if (f.status == 409 || f.status == 429) return outcome_class::retry_same_key;
    // 424 (external dependency failed) and 5xx: Stripe may have executed and saved the request.
    if (f.status >= 500 || f.status == 424) return outcome_class::indeterminate;
    // Only what the event itself got wrong is final: a validation error, or an object the request names that
    // does not exist ("No such customer", with `param`). A 404 naming no parameter is the URL (a wrong
    // --stripe-api-base), and 401/403/405/3xx/… are credentials, permissions or something in front of
    // Stripe: an operator fixes those, and the event must still be charged then.
    if (f.status == 400 || (f.status == 404 && !f.error_param.empty())) return outcome_class::rejected;
    return outcome_class::setup_error;
}

std::optional<bool> parse_should_retry(std::optional<std::string_view> header) noexcept {
    if (!header) return std::nullopt;
    if (iequals(*header, "true")) return true;
    if (iequals(*header, "false")) return false;
    return std::nullopt;
}

}  // namespace cg::stripe
