// The age of the oldest `pending` ledger row, for the "pending rows older than the lease × N" alert: a row
// stays pending only while a charge is in flight or waits for recovery, so a growing age means messages
// that should have come back did not (lost, stuck at max attempts, every worker down).
//
// A cheap periodic query (the pending rows are few and sit in the partial index
// billing_records_pending_lease_idx), exported as gauges:
//   chargeguard_billing_oldest_pending_age_seconds  0 when there is no pending row
//   chargeguard_billing_pending_records             how many rows are pending
// and, once watch_abandoned() gave it the sweep bound (sweeper.hpp), the rows the sweeper would take up —
// pending, no live lease, no activity (greatest(updated_at, lease_until)) for longer than the bound:
//   chargeguard_billing_abandoned_records
//   chargeguard_billing_oldest_abandoned_age_seconds  time since the least recent activity of one, 0 when
//   none
// A sweeper that heals keeps the age under bound + its interval + the time to resolve a row.
// The same round also exports what an operator reads after an outage (docs/operating/runbook.md):
//   chargeguard_dead_letters_open{reason}          letters neither replayed nor dismissed, by reason class
//   chargeguard_dead_letters_dismissed             letters closed by `dead-letters dismiss`
// A failed query keeps the previous values and counts in chargeguard_billing_pending_age_errors_total.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <memory>

#include "core/log.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::metrics {
class registry;
}

namespace cg::billing {

class pending_age_monitor {
  public:
    // Registers the gauges in `reg` (which must outlive the monitor). Runs on `pool`'s executor.
    pending_age_monitor(std::shared_ptr<pg::pool> pool, metrics::registry& reg, logger log,
                        std::chrono::milliseconds interval = std::chrono::seconds(15));
    ~pending_age_monitor();

    // Starts the periodic query (first one at once) on `ex` (the pool's executor).
    void start(asio::any_io_executor ex);
    // Stops the loop; completes once a query in progress has finished. Call on the same executor.
    net::awaitable<void> stop();
    // Also reports the abandoned rows by this sweep bound, from the next query on. Same executor.
    void watch_abandoned(std::chrono::milliseconds bound);

    struct state;

  private:
    std::shared_ptr<state> st_;
};

// For consume: a started monitor that stops on the runtime's shutdown, kept alive by the returned pointer.
std::shared_ptr<pending_age_monitor> start_pending_age_monitor(asio::any_io_executor ex,
                                                               std::shared_ptr<pg::pool> pool,
                                                               metrics::registry& reg, logger log);

}  // namespace cg::billing
