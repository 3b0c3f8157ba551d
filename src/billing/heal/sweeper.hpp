// The sweeper: the ledger heals rows that nobody works on any more (docs/operating/ha-postgres.md).
//
// Recovery normally runs when NSQ redelivers a message. A `pending` row whose message is gone — FINed after a
// settle that a PostgreSQL failover then lost, or dropped by an operator — would stay pending forever. The
// sweeper (one per sidecar) periodically looks for pending rows of its own key namespace with no live lease
// and no activity for longer than the sweep bound (sweep_bound below), and runs each through the pipeline's
// own machine (charge_flow::resume): the lease is taken with the ledger's take-lease statement, so a live
// delivery of the same key or another sidecar's sweeper is excluded by exactly the rules that exclude a
// second redelivery today; then RECOVER decides as for a redelivery — the same key inside Stripe's 24 h
// window (Stripe replays a charge that succeeded, or makes the one that never happened), the charge search
// after it. A row with no Stripe object is therefore charged by the sweeper itself, from the fields the row
// holds (migration 0011), rather than re-published: a re-published event is one more message that can race
// its original and has to be handled by the same machine anyway, while the row already is the event.
//
// Correction revisions (docs/design.md §4a) are swept the same way: a revision left `pending` whose lease
// expired and which has shown no life (planned, leased, released, a move's attempt or renewal) within the
// bound runs through the corrections machine as its redelivery would (charge_flow::resume_correction) — its
// lease taken in cg_correction_admit, each pending money move re-sent under its key inside Stripe's 24 h
// window, searched for by metadata after it (a charge among the customer's charges, a refund among its
// charge's refunds). The revision's raw body is its event.
//
// A pending row with no live lease for which a webhook already brought a payment carrying its key (an event
// recorded deferred: the worker that called Stripe died before recording the answer) is taken up at the
// next sweep, without waiting for the bound: the receiver may not settle a pending row, so recovery is the
// only way its fact gets applied (abandoned_sql::record_has_deferred_fact).
//
// After a failover (pg::pool::on_failover: a new connection reached a promoted standby, another cluster or
// another address) the sweeper does not wait for the bound: commits the old primary acknowledged may be lost,
// and a row whose `charged` commit was lost after its message was FINed has no delivery left. So it sweeps
// soon (after failover_grace, below), and again every failover_interval for failover_window, the pending rows
// of its namespace whose last write is older than the failover — whatever their age. A row written since (by
// a live delivery, or by a sweep that left it pending) is not taken again in that window; its message or the
// regular bound brings it back. The failover sweeps wait a grace of two lease renewals and an interval, and
// within it every live delivery writes its row: one awaiting Stripe renews its lease (or, finding the lease
// not its own — its take or a renewal was among the lost commits — notes the call in flight); one before or
// after its call records its attempt, settles, releases or requeues, and a Stripe call is always preceded by
// an epoch-checked write. So a row nothing wrote since the failover, once the grace has passed, has no live
// holder, whether or not the new primary still shows a lease on it: such a lease (its holder finished and
// FINed, or died) is ended under the epoch it was read with (sweep_sql::end_stale_lease) — a holder's write
// meanwhile moves the epoch and keeps it — and the row recovered at once rather than when the lease runs
// out (chargeguard_billing_failover_leases_ended_total). The lease and the recovery are then the same as for
// any swept row: a live delivery is never raced into a second Stripe call, a late write of the old holder is
// fenced by the epoch, and a row whose attempt was lost too is settled by the same key or the charge search.
// Before the grace, at once, it re-applies the settles this sidecar's own deliveries wrote that the new
// primary shows reverted under a lease they held (settle_journal.hpp): no Stripe call, and no wait at all.
//
// Rows of another key namespace are left to their own sidecars (selected by key_namespace, and the key is
// recomputed and compared before anything runs); rows written before migration 0011 have no namespace and
// are left to `reconcile`.
#pragma once

#include <array>
#include <asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "billing/flow/charge_flow.hpp"
#include "billing/machine/outcome.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::metrics {
class registry;
}

namespace cg::billing {

class pending_age_monitor;

// The sweep bound: how long a pending row must have shown no activity (no write, and its lease expired that
// long ago) before the sweeper treats its message as gone. Activity is greatest(updated_at, lease_until).
// A message that still exists touches its row (takes the lease) within this bound of the row's last
// activity, because every path back to the row is bounded:
//   - in flight on a worker that died: nsqd redelivers within msg_timeout of the last TOUCH;
//   - requeued after a row write: back after the longest requeue delay the pipeline uses — max of
//     lease_held_delay, retry_same_key_delay, indeterminate_delay, stripe_unavailable_delay, the PostgreSQL
//     backoff's max and new_key_quiet + 100 ms (the wait before a new key generation), capped at
//     max_requeue_delay;
//   - requeued because another worker holds the lease: back once that lease expired (lease_until is part of
//     the activity) plus the requeue's jitter, under max(lease_held_delay, lease / 10);
//   plus one more msg_timeout as margin for a redelivery to reach a busy worker.
//   bound = 2 × msg_timeout + longest requeue + max(lease_held_delay, lease / 10)
// (defaults: 2 × 60 s + 300.1 s + 10 s = 430.1 s). Safety never depends on it — the lease excludes a live
// delivery whatever the bound — it only keeps the sweeper from doing a live message's work.
std::chrono::milliseconds sweep_bound(const charge_flow_config& p,
                                      std::chrono::milliseconds msg_timeout) noexcept;

// How often to sweep for a bound: a quarter of it, within [1 s, 60 s].
std::chrono::milliseconds sweep_interval(std::chrono::milliseconds bound) noexcept;

struct sweeper_config {
    // Named by the dead letters of swept rows (a replay re-publishes there): consume's --topic/--channel.
    std::string topic = "billing";
    std::string channel = "chargeguard";
    // The sweep bound and the time between sweeps (the first one after one interval). start_sweeper derives
    // a zero one (sweep_bound, sweep_interval); the sweeper itself takes them as given.
    std::chrono::milliseconds after{0};
    std::chrono::milliseconds interval{0};
    std::size_t batch = 100;  // rows per sweep at most, least recently active first
    // After a failover (after_failover): wait failover_grace, then sweep at once and every failover_interval
    // until failover_window (from the failover) has passed. derive_failover_sweeps fills unset ones.
    std::chrono::milliseconds failover_grace{-1};
    std::chrono::milliseconds failover_window{0};
    std::chrono::milliseconds failover_interval{0};
};

// How often to sweep after a failover for a lease: a thirtieth of it, within [1 s, 5 s] (2 s by default).
std::chrono::milliseconds failover_sweep_interval(std::chrono::milliseconds lease) noexcept;

// Fills the failover settings left unset (a zero interval or window, a negative grace) from the pipeline's:
// interval failover_sweep_interval(lease); grace 2 × lease_renew_interval + interval (32 s by default);
// window max(lease, grace) + 2 × interval (64 s by default).
void derive_failover_sweeps(sweeper_config& c, const charge_flow_config& p) noexcept;

// What one sweep did.
struct sweep_report {
    std::size_t found = 0;              // abandoned rows the query returned
    std::size_t corrections_found = 0;  // abandoned correction revisions (pending) the second query returned
    std::size_t foreign = 0;  // rows (or revisions) whose key this sidecar would not compute (left alone)
    std::array<std::size_t, verdict_reason_count> by_reason{};  // the verdicts of the rows run

    std::size_t count(verdict_reason r) const noexcept { return by_reason[static_cast<std::size_t>(r)]; }
};

class sweeper {
  public:
    // `p` (and its ledger and Stripe client) must outlive the sweeper; `reg` too when given. Runs on `pool`'s
    // executor (the main loop), like the pipeline. Counts rows swept by outcome in
    // chargeguard_billing_swept_total{outcome} (a verdict reason, or foreign_namespace) and failed sweeps in
    // chargeguard_billing_sweep_errors_total.
    sweeper(sweeper_config cfg, charge_flow& p, std::shared_ptr<pg::pool> pool, logger log,
            metrics::registry* reg = nullptr);
    ~sweeper();
    sweeper(const sweeper&) = delete;
    sweeper& operator=(const sweeper&) = delete;

    // One sweep: reads up to `batch` abandoned rows and runs each through charge_flow::resume, one after the
    // other; then up to `batch` abandoned correction revisions, each through charge_flow::resume_correction.
    // Returns what it did, or a query's error (rows already run stay counted in the metrics).
    // `since_failover` (after a failover, once its grace has passed): instead of the bound, the pending rows
    // last written before that long ago, whatever their age, a lease on them ended first.
    // Completes on the pool's executor; not cancellable while a row is at Stripe (the client's timeouts bound
    // it). Stops between rows once stop() was called.
    net::awaitable<result<sweep_report>> sweep_once(
        std::optional<std::chrono::milliseconds> since_failover = std::nullopt);

    // PostgreSQL failed over (pg::pool::on_failover): after failover_grace sweep at once, then every
    // failover_interval until failover_window has passed, the rows last written before the failover, leased
    // or not (see above). On the sweeper's executor.
    void after_failover();

    // Sweeps every `interval` on `ex` (the pool's executor) until stop().
    void start(asio::any_io_executor ex);
    // Ends the loop; completes once a sweep in progress has finished its current row. Same executor.
    net::awaitable<void> stop();

    const sweeper_config& config() const noexcept { return cfg_; }

    struct state;

  private:
    sweeper_config cfg_;
    std::shared_ptr<state> st_;
};

// For consume: a sweeper with the bound derived from the pipeline's config and --msg-timeout (a non-zero
// cfg.after / cfg.interval overrides it), started on `ex`, told of `pool`'s failovers (after_failover: the
// pool must be created with pool_options::watch_failover to see them), stopped on the runtime's shutdown by
// the caller (sweeper::stop), kept alive by the returned pointer. When `age` is given it also reports the
// oldest abandoned row by the same bound (pending_age_monitor::watch_abandoned).
std::shared_ptr<sweeper> start_sweeper(asio::any_io_executor ex, charge_flow& p,
                                       std::shared_ptr<pg::pool> pool, sweeper_config cfg,
                                       std::chrono::milliseconds msg_timeout, metrics::registry& reg,
                                       logger log, pending_age_monitor* age = nullptr);

}  // namespace cg::billing
