// Pacing Stripe requests without I/O: a token bucket the caller feeds the clock, shared by the settlement
// poller (billing/heal) and `chargeguard reconcile` (billing/report, src/app/reconcile_steps.hpp).
#pragma once

#include <chrono>
#include <optional>

namespace cg::billing {

// A token bucket for Stripe requests: at most `per_second` on average, bursts of `burst`. delay(now) returns
// how long to wait before the next request may start and books it. Pure (the caller passes the clock).
class request_pacer {
  public:
    using clock = std::chrono::steady_clock;
    request_pacer(double per_second, unsigned burst);
    clock::duration delay(clock::time_point now);

  private:
    double per_second_;
    double burst_;
    double tokens_;
    std::optional<clock::time_point> last_;
};

}  // namespace cg::billing
