// Refunds: POST /v1/refunds under an idempotency key, and the search of a charge's refunds by metadata (GET
// /v1/refunds?charge=…), for the corrections job (billing/flow/corrections.hpp). Built on client::call, so
// every call shares the client's retries, pacing, metrics and executors (see client.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"
#include "net/tokens.hpp"
#include "stripe/json.hpp"
#include "stripe/types.hpp"

namespace cg::stripe {

class client;

struct refund_request {
    std::string charge;  // ch_…
    std::int64_t amount = 0;
    stripe::metadata metadata;
    std::string idempotency_key;  // required (≤ 255 chars)
    std::string stripe_account;  // the charge's Connect account (sent as Stripe-Account); empty: the platform
};

// What one refund call came to, after the client's own bounded retries. Classified as creates are
// (outcome.hpp): succeeded with the refund; rejected for a refund Stripe refuses as sent (amount_too_large,
// charge_already_refunded, charge_disputed, charge_not_refundable); indeterminate when it may have happened.
struct refund_outcome {
    outcome_class cls = outcome_class::indeterminate;
    int http_status = 0;
    bool replayed = false;
    api_error error;
    std::string message;  // one line for logs and last_error; never a secret
    std::optional<stripe::refund> refund;
};

// POST /v1/refunds (charge, amount, metadata). Completes on the caller's executor; `c` must outlive it.
net::awaitable<refund_outcome> create_refund(client& c, refund_request req);

// Pages through the refunds of `charge` (newest first) for the first whose metadata[name] is `value`;
// nullopt when there is none; in `stripe_account` (empty: the platform). Errors carry stripe::errc. Same
// executor and lifetime rules.
net::awaitable<result<std::optional<refund>>> find_refund_by_metadata(client& c, std::string charge,
                                                                      std::string name, std::string value,
                                                                      std::string stripe_account = {});

}  // namespace cg::stripe
