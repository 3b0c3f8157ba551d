// Errors of the Stripe layer. Reads (retrieve, list) fail with the code of the outcome class that
// stopped them; configuration problems have their own codes.
#pragma once

#include <system_error>

#include "stripe/outcome.hpp"

namespace cg::stripe {

enum class errc {
    ok = 0,
    declined,
    cap_exceeded,
    idempotency_conflict,
    retry_same_key,  // still failing after the bounded retries; try again later with the same key
    indeterminate,   // the request may or may not have taken effect
    rejected,        // validation, a named object not found: the request cannot succeed as sent
    setup_error,     // credentials, permissions, address: refused for our setup, not the request
    bad_response,    // a 2xx whose body is not the expected JSON object
    bad_config,      // missing key, unreadable key file, bad URL
};

const std::error_category& category() noexcept;

// The error a call that ended in `c` fails with (ok for succeeded).
errc errc_for(outcome_class c) noexcept;
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), category()};
}

}  // namespace cg::stripe

template <>
struct std::is_error_code_enum<cg::stripe::errc> : std::true_type {};
