// Applying what Stripe says about payments to the ledger (settlement.hpp decides; this file reads and writes
// the rows). Three sources, one step:
//
//   * a webhook event (record_event): recorded once in stripe_webhook_events and applied to the ledger row
//     it names in the same transaction, so an acknowledged event is never recorded without its effect (a
//     redelivery would be ignored as a duplicate and the effect lost) and never applied twice;
//   * the events recorded while a row was still pending (apply_recorded): the pipeline applies them when it
//     leaves the row processing (a payment_failed that arrived before the create call's answer), and the
//     poll applies those that wait for a row the pipeline settled otherwise;
//   * a retrieved PaymentIntent or charge (apply_retrieved): the poll of rows left processing.
//
// Refunds are recorded by what they name, in the event's transaction (migration 0016): charge.refunded's
// cumulative amount_refunded per charge, and each refund object (refund.created, refund.updated,
// charge.refund.updated) by its id (re_…) with the furthest status it reached. A charged
// row's refunded_cents is then set from them (cg_refunded_cents) on every write, so one refund reported by
// its charge's event and by its own, in any order, duplicated or not, counts once, and a refund that ends
// failed or canceled gives its amount back. Refund facts naming no ledger row (a vault-only payment) are
// recorded all the same: the vault reads them (vault::store::apply_refund_by_object).
//
// The row is found by the ids the event names: charge_id, then payment_intent_id, then metadata
// [billing_key]; an event naming no row is recorded and counted (unknown_object). Finding is not proving:
// the fact moves the row only when its ids reach an id the row holds, in the row's Stripe account
// (billing::link_payment); a fact about another payment is other_payment, and one that found a row holding
// no Stripe id by metadata alone is deferred while the row is pending (the pipeline's recovery, under the
// lease, records the row's ids and the fact is applied by them: the sweeper takes such a row up at its next
// sweep) and unconfirmed otherwise (changes nothing).
// The row is locked (FOR UPDATE) while the step runs, so concurrent events for one row apply one after the
// other. A row that becomes failed_after_processing gets its dead letter in the same transaction, from the
// delivery that left it processing (billing_records.nsq_topic, nsq_channel, raw_body), once per delivery.
//
// Each coroutine acquires a pooled connection and gives it back (rolled back by the pool if the
// transaction did not commit); errors are pg errors passed through. Completes on the pool's executor; the
// pool must outlive every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/settlement.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "stripe/webhook_event.hpp"

namespace cg::billing {

// The dead letter reason of a payment that failed after processing ("failed after processing: <code>").
inline constexpr std::string_view failed_after_processing_reason = "failed after processing";

// What applying facts to one row did.
struct row_settlement {
    std::string key;
    settlement_row before;
    settlement_row after;
    std::size_t facts = 0;     // facts applied (events read, or the one retrieved)
    bool failed_now = false;   // became failed_after_processing: its dead letter was written
    bool charged_now = false;  // became charged
    bool anomaly = false;      // see settlement_change::anomaly
    std::string note;          // the last non-empty note
};

struct event_record_result {
    bool duplicate = false;  // already recorded: nothing was done
    // What the event came to: applied, no_change, deferred, other_payment, unconfirmed, unknown_type, or
    // "unknown_object" (no ledger row names its payment), "unreadable" (a type acted on whose object is
    // not the one expected: recorded, not applied).
    std::string outcome;
    std::optional<row_settlement> row;  // the row it was applied to
    payment_fact fact;
};

// A row the poll asks Stripe about.
struct processing_row {
    std::string key;
    std::optional<std::string> charge_id;
    std::optional<std::string> payment_intent_id;
    std::string stripe_account{};  // retrieved in this connected account (empty: the platform)
};

class settlement_store {
  public:
    explicit settlement_store(std::shared_ptr<pg::pool> pool) : pool_(std::move(pool)) {}

    // Records the event (envelope `env`, verified body `body`) once and applies it; see above.
    net::awaitable<result<event_record_result>> record_event(stripe::webhook_event env, std::string body);

    // Applies every recorded event naming the row's payment (its charge, its PaymentIntent or its key), in
    // their creation order (the step does not depend on it). nullopt: no such row.
    net::awaitable<result<std::optional<row_settlement>>> apply_recorded(std::string key);

    // Applies one fact retrieved from Stripe to the row and notes the poll (polled_at). nullopt: no row.
    net::awaitable<result<std::optional<row_settlement>>> apply_retrieved(std::string key, payment_fact f);

    // Rows processing whose last word from Stripe (or poll) is older than `after`, oldest first.
    net::awaitable<result<std::vector<processing_row>>> due_for_poll(std::chrono::milliseconds after,
                                                                     std::int64_t limit);

    // Rows processing now, and the age of the oldest (by processing_since; 0 when none), in seconds.
    net::awaitable<result<std::pair<std::int64_t, double>>> processing_summary();

    // Keys of rows no longer pending that have events still marked deferred (received before the row
    // settled, more than `older_than` ago).
    net::awaitable<result<std::vector<std::string>>> rows_with_deferred_events(
        std::chrono::milliseconds older_than, std::int64_t limit);

  private:
    std::shared_ptr<pg::pool> pool_;
};

}  // namespace cg::billing
