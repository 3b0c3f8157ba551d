// What makes a pending ledger row or correction revision abandoned, as SQL fragments: the sweeper selects by
// it (sweeper.cpp) and the pending-age gauges count by it (pending_age.cpp), so both use these.
#pragma once

#include <string>

namespace cg::billing::abandoned_sql {

// A pending billing_records row's last sign of life: its last update, or the end of its lease.
inline const std::string record_active = "greatest(updated_at, coalesce(lease_until, updated_at))";
// The row holds no live lease (it expired, was released or was never taken).
inline const std::string record_unleased = "(lease_until IS NULL OR lease_until < now())";

// A webhook event found the pending row and was deferred (billing::settle_result::deferred): Stripe holds a
// payment carrying the row's key while no worker holds its lease, so the worker that made the payment is
// gone or has let go. The sweeper takes such a row up at its next sweep instead of waiting for the sweep
// bound: only the pipeline's recovery, under the lease, may settle a pending row (settlement.hpp), and the
// bound only keeps the sweeper from doing a live message's work, never safety. Found through the event's
// billing_key (indexed); a pending row holds no Stripe id, so metadata is how such an event found it.
// `billing_records` is the row's table, unaliased.
inline const std::string record_has_deferred_fact =
    "EXISTS (SELECT 1 FROM stripe_webhook_events e WHERE e.billing_key = billing_records.key "
    "AND e.applied_to = billing_records.key AND e.outcome = 'deferred')";

// The newest Stripe attempt or renewal among the moves of revision `c`, as mv.last_attempt: joined after
// `FROM billing_corrections c`.
inline const std::string revision_moves_join =
    "CROSS JOIN LATERAL (SELECT max(m.last_stripe_attempt_at) AS last_attempt "
    "FROM billing_correction_moves m WHERE m.correction_key = c.key) mv";
// A pending revision's last sign of life: planned (started_at), leased or released (lease_until; a release
// sets it just in the past), or a move's Stripe attempt or renewal.
inline const std::string revision_active = "greatest(c.started_at, c.lease_until, mv.last_attempt)";
inline const std::string revision_unleased = "(c.lease_until IS NULL OR c.lease_until < now())";

}  // namespace cg::billing::abandoned_sql
