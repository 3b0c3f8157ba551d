// The recovery search as one call: which payment at Stripe carries a ledger row's base key, and what it makes
// of the row, for `chargeguard reconcile` (which applies the step as a report line). The charge flow's
// RECOVER takes the same two lists as commands of its fsm (billing/machine/charge_fsm.hpp), which reads
// them with the same rules (machine::on_found, step_for_found_intent, machine::superseded_failure).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/decision.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "stripe/types.hpp"

namespace cg::stripe {
class client;
}

namespace cg::billing {

struct recovery_query {
    std::string stripe_customer_id;
    std::string key;  // the base key: metadata[billing_key] of every generation's payment
    std::optional<sys_time> first_attempt;
    std::chrono::seconds slack = default_search_slack;
    // The event charges through a PaymentIntent: when no charge carries the key, the customer's
    // PaymentIntents are searched too (an intent that never reached the card made no charge).
    bool payment_intent = false;
    // The connected account the row charges on behalf of (empty: the platform): the search lists that
    // account's objects only, so another account's payment carrying the same metadata is never adopted.
    std::string stripe_account{};
    // The payments earlier attempts of a retried row made (retry_store::superseded_payments): a failure
    // among them is never read as this generation's answer, however recent.
    std::vector<std::string> superseded{};
};

// What the payment found makes of the row.
enum class found_step {
    none,             // nothing carries the key (or only what says nothing of this generation)
    mark_charged,     // it succeeded
    mark_declined,    // it failed at once
    mark_processing,  // the money has not moved yet: the row waits for Stripe's final answer
    still_open,       // an intent succeeding without a charge yet, or a status the pinned API version
                      // does not define: look again later, never recharge
};

struct recovery_found {
    found_step step = found_step::none;
    // What carries the key: the charge when the charges had one, else the PaymentIntent.
    std::optional<stripe::charge> charge;
    std::optional<stripe::payment_intent> intent;
    // The ids and status the ledger step records.
    std::optional<std::string> charge_id;
    std::optional<std::string> payment_intent_id;
    std::string status;
    std::string decline;  // mark_declined: why ("card_declined", "payment intent pi_… is canceled: …")
};

// Called before each Stripe search (charges, then PaymentIntents): a caller's pacer.
using before_search_fn = std::function<net::awaitable<void>()>;

// Lists the customer's charges — and, for a PaymentIntent event with no charge carrying the key, its
// PaymentIntents — since the first attempt less the slack (all of them without a first attempt), for the one
// carrying the key. Charges first: every confirmed intent that reached the card made one (carrying the
// intent's metadata). A failed payment created well before the first attempt belongs to an earlier life of
// the row and is ignored, as is an intent never confirmed. Errors: the search's (nothing may be charged
// then). Completes on the caller's executor; `log` and `stripe` must outlive it.
net::awaitable<result<recovery_found>> search_by_key(stripe::client& stripe, recovery_query q,
                                                     const logger& log, before_search_fn before = {});

}  // namespace cg::billing
