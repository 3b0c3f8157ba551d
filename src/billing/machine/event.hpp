// A billing event as published on NSQ (one JSON object per message), parsed and validated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::billing {

// {"customer_id":"acme-42","billing_period":"2026-11","amount_cents":1999,"currency":"usd",
//  "stripe_customer_id":"cus_…","description":"optional","payment_method":"pm_… (optional)",
//  "off_session":true, "stripe_account":"acct_… (optional)"}. Unknown fields are ignored. With payment_method
//  the event is charged through a
// confirmed PaymentIntent (off_session defaults to true: a billing run has no customer at hand); without it,
// through /v1/charges (off_session is then refused: it would mean nothing).
struct billing_event {
    std::string customer_id;         // the billing system's customer id: [A-Za-z0-9_.@-]{1,255}
    std::string billing_period;      // e.g. "2026-11": [A-Za-z0-9_.-]{1,64}
    std::int64_t amount_cents = 0;   // minor units, 1 .. 99 999 999
    std::string currency;            // ISO 4217, lower case
    std::string stripe_customer_id;  // cus_…
    std::string description;         // optional, ≤ 500 chars
    std::string payment_method{};    // optional: pm_… / card_… / src_… → PaymentIntent
    bool off_session = true;         // only with payment_method
    // optional: the Stripe Connect account charged on behalf of (sent as the Stripe-Account header on every
    // call for the event, part of its key); empty: the platform's own account.
    std::string stripe_account{};

    bool connected() const noexcept { return !stripe_account.empty(); }
    // 0 (or absent): the period's charge. N > 0: a correction, amount_cents the period's new total
    // (0 .. 99 999 999): billing/flow/corrections.hpp.
    std::int32_t revision = 0;

    bool uses_payment_intent() const noexcept { return !payment_method.empty(); }
    bool is_correction() const noexcept { return revision > 0; }
};

enum class event_errc { ok = 0, too_large, not_json, missing_field, bad_field };
const std::error_category& event_category() noexcept;
inline std::error_code make_error_code(event_errc e) noexcept {
    return {static_cast<int>(e), event_category()};
}

inline constexpr std::size_t max_event_bytes = 64 * 1024;

// True when `s` can name a connected account: "acct_" and 1..250 characters of [A-Za-z0-9].
bool valid_stripe_account(std::string_view s) noexcept;

// Parses and validates one event. On failure the error message names the field and the rule, for the
// dead-letter table ("amount_cents: must be an integer in 1..99999999").
result<billing_event> parse_event(std::string_view body);

// The event as a producer would publish it (parse_event(to_json(e)) gives `e` back for a valid event):
// the body of the stand-in delivery the sweeper runs a ledger row through, and of its dead letters.
std::string to_json(const billing_event& e);

}  // namespace cg::billing

template <>
struct std::is_error_code_enum<cg::billing::event_errc> : std::true_type {};
