// The recovery search as one call: which payment at Stripe carries a ledger row's base key, and the money
// machine's reading of it (machine::on_found, the command the charge fsm takes for the same find), for
// `chargeguard reconcile` (which applies machine::on_reconcile_found of it as a report line). The charge
// flow's RECOVER takes the same two lists as commands of its fsm (billing/machine/charge_fsm.hpp); both
// drop a failure from an earlier life of the key by machine::superseded_failure. This file keeps no rule of
// its own about what a found payment means.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/decision.hpp"
#include "billing/machine/machine.hpp"
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

struct recovery_found {
    // What the payment found makes of the row, as the machine reads it (machine::on_found on the charge
    // table). `none` with neither `charge` nor `intent`: nothing carries the key (or only what says nothing
    // of this generation, or an intent Stripe never tried).
    machine::found_command command = machine::found_command::none;
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
