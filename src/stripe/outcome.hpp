// The one decision billing needs from every Stripe answer (docs/design.md §4). Pure.
#pragma once

#include <optional>
#include <string_view>

namespace cg::stripe {

enum class outcome_class {
    succeeded,             // 2xx: the charge exists
    declined,              // 402 card_error / authentication_required: final
    cap_exceeded,          // 402 spend_cap_exceeded from the vault proxy: final, alert
    idempotency_conflict,  // 400 idempotency_error: same key, different parameters
    retry_same_key,        // 409 in use, 429, not sent, Stripe-Should-Retry: true — nothing happened yet
    indeterminate,         // 5xx, or timeout/disconnect after sending: may have happened
    rejected,              // 400 (validation), 404 naming a parameter: the event itself cannot succeed
    setup_error,           // 401, 403, a 404 naming no parameter, 405, 3xx, other 4xx: refused for our setup
                           // (key, permissions, address, something in front of Stripe), not for the event:
                           // nothing happened; the same request succeeds once an operator fixes the cause
};

std::string_view to_string(outcome_class c) noexcept;

// What a response says about itself.
struct response_facts {
    int status = 0;
    std::string_view error_type;       // error.type from the JSON body, if any
    std::string_view error_code;       // error.code
    std::optional<bool> should_retry;  // Stripe-Should-Retry header
    std::string_view error_param;      // error.param
};

outcome_class classify_response(const response_facts& f) noexcept;

// No response: before any byte was sent nothing can have happened; afterwards anything may have.
constexpr outcome_class classify_transport_failure(bool request_sent) noexcept {
    return request_sent ? outcome_class::indeterminate : outcome_class::retry_same_key;
}

// Parses a Stripe-Should-Retry header value.
std::optional<bool> parse_should_retry(std::optional<std::string_view> header) noexcept;

}  // namespace cg::stripe
