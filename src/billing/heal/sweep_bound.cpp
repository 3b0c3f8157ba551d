// The sweeper's bounds and intervals (sweeper.hpp): pure arithmetic on the pipeline's settings.
#include <algorithm>

#include "billing/heal/sweeper.hpp"

namespace cg::billing {

using std::chrono::milliseconds;

milliseconds sweep_bound(const charge_flow_config& p, milliseconds msg_timeout) noexcept {
    auto longest_requeue =
        std::max({p.lease_held_delay, p.retry_same_key_delay, p.indeterminate_delay,
                  p.stripe_unavailable_delay, p.postgres_backoff.max, p.new_key_quiet + milliseconds(100)});
    longest_requeue = std::min(longest_requeue, p.max_requeue_delay);
    auto lease_held_jitter = std::max(p.lease_held_delay, p.lease / 10);
    return 2 * msg_timeout + longest_requeue + lease_held_jitter;
}

milliseconds sweep_interval(milliseconds bound) noexcept {
    return std::clamp(bound / 4, milliseconds(1'000), milliseconds(60'000));
}

milliseconds failover_sweep_interval(milliseconds lease) noexcept {
    return std::clamp(lease / 30, milliseconds(1'000), milliseconds(5'000));
}

void derive_failover_sweeps(sweeper_config& c, const charge_flow_config& p) noexcept {
    if (c.failover_interval.count() <= 0) c.failover_interval = failover_sweep_interval(p.lease);
    if (c.failover_grace.count() < 0) c.failover_grace = 2 * p.lease_renew_interval + c.failover_interval;
    if (c.failover_window.count() <= 0)
        c.failover_window = std::max(p.lease, c.failover_grace) + 2 * c.failover_interval;
}

}  // namespace cg::billing
