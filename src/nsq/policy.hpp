// Pure policies of the consumer (docs/contributing.md "Pure policies"): RDY distribution, handler-failure
// backoff, keepalive TOUCH timing, reconnect delays. No I/O, no clock reads: time comes in as arguments.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace cg::nsq {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// --- RDY distribution -------------------------------------------------------------------------------
struct rdy_conn {
    unsigned current = 0;     // the RDY last sent on this connection
    unsigned max_rdy = 2500;  // nsqd's max_rdy_count for it
    clock::duration idle{};   // time since its last message (or since it got RDY)
};

// The RDY each connection should have, never more than max_in_flight in total nor max_rdy each.
// n ≤ max_in_flight: max_in_flight / n each (the remainder to the first ones), at least 1.
// n > max_in_flight: RDY 1 for max_in_flight connections; a holder idle longer than `idle_timeout`
// gives its RDY 1 to the next connection without one, round-robin from `cursor` (updated).
std::vector<unsigned> plan_rdy(std::span<const rdy_conn> conns, unsigned max_in_flight,
                               clock::duration idle_timeout, std::size_t& cursor);

// --- handler-failure backoff (go-nsq's startStopContinueBackoff) ------------------------------------
class backoff_policy {
  public:
    enum class action { none, resume_all, backoff };
    struct decision {
        action act = action::none;
        milliseconds duration{0};  // for backoff: how long to keep RDY 0 before testing with RDY 1
    };

    backoff_policy(milliseconds multiplier, milliseconds max) : mult_(multiplier), max_(max) {}

    // A handler finished the message.
    decision on_success() { return signal(+0, -1); }
    // A handler failed (or asked to requeue with backoff).
    decision on_failure() { return signal(+1, 0); }
    // A requeue without backoff: the level stays, an ongoing backoff continues.
    decision on_continue() { return signal(0, 0); }
    // The backoff timer fired: the consumer sends RDY 1 on one connection to test.
    void timeout_expired() { in_timeout_ = false; }

    int level() const noexcept { return level_; }
    bool in_timeout() const noexcept { return in_timeout_; }
    bool backing_off() const noexcept { return level_ > 0; }
    milliseconds duration_for(int level) const;

  private:
    decision signal(int up, int down);
    milliseconds mult_, max_;
    int level_ = 0;
    bool in_timeout_ = false;
};

// What keeps a backoff moving: while backing off, one of these must be under way — the backoff timer
// (in_timeout), a trial RDY 1 on a live connection, or a handler (running or queued) whose result decides
// the next step. With none (the trial's connection dropped, or the trial found no connection), the
// consumer must arm the backoff timer again, or RDY stays 0 everywhere for ever.
struct backoff_progress {
    bool backing_off = false;
    bool in_timeout = false;
    bool trial_out = false;  // a subscribed connection has RDY > 0
    bool handlers_pending = false;
};
bool backoff_needs_rearm(const backoff_progress& p) noexcept;

// --- keepalive --------------------------------------------------------------------------------------
// When to TOUCH next: msg_timeout / 2 from `now`, or nullopt once a TOUCH could no longer extend the
// deadline because nsqd caps it at delivery + max_msg_timeout.
std::optional<clock::time_point> next_touch(clock::time_point now, clock::time_point delivered,
                                            milliseconds msg_timeout, milliseconds max_msg_timeout);

// --- reconnect --------------------------------------------------------------------------------------
// min · 2^(attempt-1) capped at max, times a jitter factor in [0.8, 1.2) from `unit` ∈ [0, 1).
milliseconds reconnect_delay(unsigned attempt, milliseconds min, milliseconds max, double unit);

// A requeue delay for requeue() without one: default · attempts, capped (go-nsq).
milliseconds default_requeue_delay(unsigned attempts, milliseconds dflt, milliseconds max);

}  // namespace cg::nsq
