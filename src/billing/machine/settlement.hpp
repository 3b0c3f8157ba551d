// How a payment that settles later moves its ledger row (DESIGN.md §4): one pure, order-independent step
// from (the row's settlement facts, one thing Stripe said) to the new facts. Stripe delivers webhooks at
// least once and in any order, and the poll of rows left `processing` says the same things again, so the
// step is a join on a lattice:
//
//   payment:  processing < failed_after_processing < charged   (a success is a fact that beats a failure
//             report: money that moved is recorded; a stale `processing` never undoes either)
//   refunded_cents, disputed_cents: the maximum seen (Stripe reports cumulative amounts; an inquiry, a
//             dispute in a warning_* status, withdraws nothing and moves no disputed amount); a refund event
//             (refund_update) proves the charge but moves no amount here: the store sets refunded_cents
//             from every refund recorded by id (settlement_store.hpp), since a refund that fails gives its
//             amount back
//   dispute_status: the furthest a dispute can go: warning_needs_response < warning_under_review <
//             warning_closed < needs_response < under_review < won < lost (an inquiry may escalate into a
//             chargeback, never back); a status Stripe adds later ranks lowest
//
// so applying the same facts in any order, any number of times, ends in the same row. A refund or a dispute
// proves the charge succeeded. A `pending` row belongs to the pipeline (a worker may hold its lease and be
// calling Stripe): facts about it are deferred, and applied once the pipeline has settled the row.
// Rows in the pipeline's other final states (declined, failed, cap_blocked, conflict) change only when
// Stripe says money moved for a declined row (an anomaly, reported); everything else about them is stale.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "billing/machine/decision.hpp"
#include "core/result.hpp"

namespace cg::billing {

// What one Stripe event (or retrieved object) says about a payment.
enum class fact_kind {
    processing,      // payment_intent.processing, a charge `pending`
    succeeded,       // payment_intent.succeeded, charge.succeeded
    failed,          // payment_intent.payment_failed, payment_intent.canceled, charge.failed
    refunded,        // charge.refunded (amount_refunded is cumulative)
    refund_update,   // refund.created, refund.updated, charge.refund.updated (one refund)
    dispute_opened,  // charge.dispute.created, .updated, .funds_withdrawn (a dispute under way)
    dispute_closed,  // charge.dispute.closed (won, lost, warning_closed), .funds_reinstated (won)
    no_news,         // a known object in a status that moves nothing (requires_action, …): noted only
    unknown_type,    // an event type chargeguard does not act on: counted, ignored
};
std::string_view to_string(fact_kind k) noexcept;

// The fact kind of a webhook event type; unknown_type for the rest.
fact_kind fact_kind_for_event(std::string_view type) noexcept;
// The fact a retrieved PaymentIntent's or charge's status states (the poll), as stripe/fact reads the status.
fact_kind fact_kind_for_intent_status(std::string_view status) noexcept;
fact_kind fact_kind_for_charge_status(std::string_view status) noexcept;

struct payment_fact {
    fact_kind kind = fact_kind::unknown_type;
    std::string source;             // the event type, or "retrieve payment_intent" / "retrieve charge"
    std::string payment_intent_id;  // pi_… the object belongs to (empty: none named)
    std::string charge_id;          // ch_… (a PaymentIntent's latest_charge, a dispute's charge)
    std::string billing_key;        // metadata[billing_key] of a PaymentIntent or charge
    std::string status;             // the object's status (PaymentIntent, charge or dispute)
    std::int64_t amount_refunded = 0;
    std::string refund_id;           // re_… (refund_update): the refund the event is about
    std::int64_t refund_amount = 0;  // its amount (its status is `status`)
    std::int64_t dispute_amount = 0;
    std::string failure;       // last_payment_error.code, failure_code or cancellation_reason
    std::int64_t created = 0;  // unix seconds: the event's creation, or when it was retrieved
    std::string account;       // acct_… the event came from (Connect), or the account retrieved in; empty:
                               // the platform's own
};

// A webhook event's body (already verified) as a fact: data.object read as a PaymentIntent, a charge or a
// dispute by the event type. errc::bad_response when the body is not an event.
result<payment_fact> parse_event_fact(std::string_view body);

// The facts of a ledger row that settlement reads and writes.
struct settlement_row {
    record_status status = record_status::pending;
    std::int64_t amount_cents = 0;
    std::optional<std::string> charge_id;
    std::optional<std::string> payment_intent_id;
    std::int64_t refunded_cents = 0;
    std::int64_t disputed_cents = 0;
    std::optional<std::string> dispute_status;
    std::string stripe_account{};  // the connected account the row charged in; empty: the platform

    bool operator==(const settlement_row&) const = default;
};

enum class settle_result {
    applied,        // the row changed
    no_change,      // a fact the row already holds (a duplicate, a stale processing, a lower amount)
    deferred,       // the row is pending: the pipeline applies it after settling the row; a row no worker
                    // holds the lease of is taken up by the sweeper's next sweep
    other_payment,  // the fact is not provably the row's payment: another PaymentIntent or charge (an
                    // earlier attempt, another integration's charge carrying the same metadata), ids that
                    // reach none the row holds, or another Stripe account
    unconfirmed,    // found by metadata only, a row past pending holding no Stripe id (cap_blocked,
                    // conflict, failed, declined without a charge): never applied. A retrieve would not
                    // prove it either: a retrieved object does not carry the key generation it was made
                    // under, and a hand-made charge matches metadata, customer and amount alike
    unknown_type,   // counted, ignored
};
std::string_view to_string(settle_result r) noexcept;

struct settlement_change {
    settle_result result = settle_result::no_change;
    settlement_row row;        // the row after the fact (unchanged unless `applied`)
    bool failed_now = false;   // processing → failed_after_processing: write the dead letter, alert
    bool charged_now = false;  // → charged
    bool anomaly = false;      // Stripe said something chargeguard never asks for: alert
    std::string note;          // one line for the log
};

// Whether a fact is the row's payment. A fact moves a row only when the ids Stripe links (a PaymentIntent's
// id and latest_charge, a charge's id and payment_intent, a refund's charge and payment_intent, a
// dispute's charge and payment_intent) reach an id the row holds, in the row's Stripe account (the event's
// `account`; none on both sides for the platform). Metadata (billing_key) only finds a candidate row.
enum class payment_link {
    same,      // an id the row holds is linked by the fact, and the accounts agree
    other,     // another account, or the row holds ids and the fact links none of them
    unproven,  // the row holds no Stripe id: nothing but metadata can have found it
};
std::string_view to_string(payment_link l) noexcept;
payment_link link_payment(const settlement_row& row, const payment_fact& f) noexcept;

// The step. Pure and total.
settlement_change apply_fact(const settlement_row& row, const payment_fact& f);

// The dispute status that wins between two (see the lattice above); either may be empty.
std::string join_dispute_status(std::string_view a, std::string_view b);

// A charged row's dispute as an operator reads it (`explain`): an inquiry (warning_*) withdrew nothing and
// is no dispute; a chargeback names its status and the amount withdrawn, and how it ended.
std::string describe_dispute(std::string_view status, std::int64_t disputed_cents);

}  // namespace cg::billing
