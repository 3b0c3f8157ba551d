// Stripe objects, requests and outcomes as chargeguard uses them. Money is integer minor units.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stripe/outcome.hpp"

namespace cg::stripe {

using metadata = std::vector<std::pair<std::string, std::string>>;

// Value of `key` in `m`, or nullopt.
std::optional<std::string_view> metadata_value(const metadata& m, std::string_view key);

struct charge {
    std::string id;  // ch_…
    std::int64_t amount = 0;
    std::string currency;
    std::string customer;
    std::string status;  // succeeded | pending | failed
    bool paid = false;
    std::int64_t created = 0;  // unix seconds
    std::string payment_intent;
    std::string description;
    std::string failure_code;
    std::string payment_method_type;  // payment_method_details.type: card, us_bank_account, sepa_debit, …
    std::string payment_method;       // pm_… (or card_…/src_…) the charge was made with
    stripe::metadata metadata;
};

// A bank debit (Stripe's delayed-notification methods): its charge is pending until the bank answers, so a
// failed one failed after processing, whether or not chargeguard saw it processing. A Charges-API debit of
// a bank account source reports `ach_debit`; a PaymentIntent's, `us_bank_account`. Read by stripe/fact.cpp,
// like the status helpers below.
bool bank_debit(std::string_view payment_method_type) noexcept;

struct payment_intent {
    std::string id;  // pi_…
    std::int64_t amount = 0;
    std::string currency;
    std::string customer;
    std::string status;  // succeeded | processing | requires_action | requires_payment_method | …
    std::string latest_charge;
    std::int64_t created = 0;
    std::string last_error_code;  // last_payment_error.code (authentication_required, card_declined, …)
    // last_payment_error.payment_method.type: the method whose attempt failed (us_bank_account for a debit
    // that failed after processing); empty when Stripe did not say.
    std::string payment_method_type;
    stripe::metadata metadata;
};

// The status helpers below are the fact function's readings (stripe/fact.hpp), for callers holding only a
// status. A PaymentIntent that succeeded holds the customer's money: the billing event is charged.
bool intent_succeeded(std::string_view status) noexcept;
// Money may still move, but has not: `processing` (a bank debit the bank has not answered; it can still
// fail days later) and `requires_capture` (an authorisation: chargeguard never asks for manual capture, so
// an intent there is an anomaly, and one nobody captures lapses). Neither is a charge.
bool intent_in_flight(std::string_view status) noexcept;
// A charge `pending` (an ACH debit made through /v1/charges) is in flight the same way.
bool charge_in_flight(std::string_view status) noexcept;

struct charge_page {
    std::vector<charge> data;
    bool has_more = false;
};

struct payment_intent_page {
    std::vector<payment_intent> data;
    bool has_more = false;
};

// The `error` object of a non-2xx answer.
struct api_error {
    std::string type;  // api_error | card_error | idempotency_error | invalid_request_error
    std::string code;
    std::string decline_code;
    std::string message;
    std::string param;
    std::string charge;
    std::string payment_intent;
};

struct charge_request {
    std::int64_t amount = 0;
    std::string currency;
    std::string customer;
    std::string description;
    stripe::metadata metadata;
    std::string idempotency_key;  // required (≤ 255 chars)
    std::string stripe_account;   // Stripe-Account: acct_… (a Connect charge); empty: the platform
};

struct payment_intent_request {
    std::int64_t amount = 0;
    std::string currency;
    std::string customer;
    std::string payment_method;
    std::string description;
    stripe::metadata metadata;
    std::string idempotency_key;  // required (≤ 255 chars)
    std::string stripe_account;   // Stripe-Account: acct_… (a Connect charge); empty: the platform
    bool confirm = true;
    bool off_session = true;
};

// A list call's filters: GET /v1/charges or GET /v1/payment_intents.
struct list_charges_request {
    std::string customer;
    std::optional<std::int64_t> created_gte;
    unsigned limit = 100;
    std::string starting_after;
    std::string stripe_account;  // Stripe-Account: the connected account's list; empty: the platform's
};
using list_request = list_charges_request;

// What one create call came to, after the client's own bounded retries.
struct charge_outcome {
    outcome_class cls = outcome_class::indeterminate;
    std::string charge_id;          // ch_… when succeeded; the failed charge on a /v1/charges decline
    std::string payment_intent_id;  // pi_… for PaymentIntent calls
    int http_status = 0;            // 0: no response
    std::string request_id;         // Request-Id of the last response
    bool replayed = false;          // Idempotent-Replayed: true
    unsigned attempts = 0;
    api_error error;      // non-2xx answers
    std::string message;  // one line for logs and last_error; never a secret
    std::optional<stripe::charge> charge;
    std::optional<stripe::payment_intent> intent;
    // A 2xx whose payment has not settled (intent_in_flight, charge_in_flight): the PaymentIntent's or the
    // charge's status; empty when it settled (or on any other answer).
    std::string in_flight_status;
};

struct refund {
    std::string id;  // re_…
    std::int64_t amount = 0;
    std::string charge;
    std::string payment_intent;
    std::string currency;
    std::string status;  // pending | requires_action | succeeded | failed | canceled
    std::int64_t created = 0;
    stripe::metadata metadata;
};

// A refund that failed or was canceled gave its money back to the charge: it moved nothing.
bool refund_undone(std::string_view status) noexcept;

struct refund_page {
    std::vector<refund> data;
    bool has_more = false;
};

}  // namespace cg::stripe
