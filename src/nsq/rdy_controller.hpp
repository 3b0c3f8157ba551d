// The consumer's RDY and handler-failure backoff state as one pure state machine (docs/contributing.md "Pure
// policies"): events in — a connection subscribed or gone, a message received, a read batch done, a
// handler finished with its backoff signal, a timer fired, max_in_flight changed, drain — and commands out
// — RDY n on a connection, arm a timer, and notes for the log. No I/O, no clock reads: time comes in with
// each event. It is the only owner of RDY state; the consumer only carries its commands out.
//
// Invariants (tests/unit/nsq/rdy_controller_test.cpp):
//   - the sum of RDY nsqd may be applying (a lowered RDY counts at its old value until the settle timer)
//     never exceeds max_in_flight, with any number of connections; with more connections than
//     max_in_flight, RDY 1 rotates among them;
//   - deliveries outstanding (received, handler not finished: queued or running) never exceed
//     max_in_flight either. nsqd sends on a connection while its in-flight count is below its RDY, so a
//     connection can hold max(RDY, outstanding there) and a connection that ended still holds its
//     outstanding deliveries until their handlers finish ("orphans"): RDY is only raised within what
//     max_in_flight leaves of Σ max(committed RDY, outstanding) + orphans. Without that, a connection that
//     joins (or takes over from one that dropped) while the others still have their deliveries in hand
//     gets messages no handler can take, which wait untouched and time out at nsqd;
//   - while backing off, something is always under way: the backoff timer, a trial RDY 1 on a live
//     connection, or a message whose handler has not finished — otherwise the backoff timer is re-armed.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nsq/policy.hpp"

namespace cg::nsq {

enum class rdy_timer { backoff, settle, redistribute };
inline constexpr std::size_t rdy_timer_count = 3;

// What a finished handler means for the backoff (go-nsq's message responses).
enum class handler_signal {
    success,  // FIN: one step out of backoff
    failure,  // REQ: one step into backoff
    neutral,  // REQ without backoff: the level stays, an ongoing backoff continues
};

struct rdy_settings {
    unsigned max_in_flight = 1;
    clock::duration low_rdy_idle_timeout = std::chrono::seconds(10);
    milliseconds settle_delay{100};
    milliseconds redistribute_interval{5000};
    milliseconds backoff_multiplier{1000};
    milliseconds max_backoff{120000};
};

struct rdy_output {
    struct rdy_command {
        std::string conn;
        unsigned count = 0;
        bool operator==(const rdy_command&) const = default;
    };
    // Arm `which` to fire after `after` (re-arming replaces the pending expiry).
    struct timer_request {
        rdy_timer which;
        milliseconds after{0};
        bool operator==(const timer_request&) const = default;
    };
    enum class note_kind {
        backoff_started,  // level, after
        backoff_ended,
        trial,       // conn got the trial RDY 1
        trial_lost,  // nothing under way while backing off: the timer is armed again (level, after)
    };
    struct note {
        note_kind kind;
        int level = 0;
        milliseconds after{0};
        std::string conn;
    };

    std::vector<rdy_command> rdy;
    std::vector<timer_request> timers;
    std::vector<note> notes;
    bool empty() const noexcept { return rdy.empty() && timers.empty() && notes.empty(); }
};

class rdy_controller {
  public:
    explicit rdy_controller(rdy_settings s);

    // Arms the redistribute timer. Call once.
    rdy_output start();
    // A connection subscribed (max_rdy: nsqd's max_rdy_count for it). It starts at RDY 0.
    rdy_output connection_added(const std::string& conn, unsigned max_rdy, clock::time_point now);
    // A connection ended; its RDY is gone with it.
    rdy_output connection_removed(const std::string& conn, clock::time_point now);
    // A message arrived on `conn`; a handler will report it with handler_finished().
    void message_received(const std::string& conn, clock::time_point now) { messages_received(conn, 1, now); }
    // `n` messages arrived on `conn` in one read at `now` (the same as n message_received() calls).
    void messages_received(const std::string& conn, unsigned n, clock::time_point now);
    // Every frame of one read on `conn` was handled: go-nsq's "re-send RDY when low".
    rdy_output read_batch_done(const std::string& conn);
    // A handler finished one message (every message_received() gets exactly one handler_finished() or
    // deliveries_dropped()). `conn` is the connection it came on while that connection is still known here
    // (not yet connection_removed()), empty once it ended.
    rdy_output handler_finished(std::string_view conn, handler_signal s, clock::time_point now);
    // The per-message fast path: when the result changes nothing but the counts (a success outside backoff
    // that frees no budget a connection waits for), applies it and returns true — no output, no clock
    // read; otherwise changes nothing and returns false: call handler_finished().
    bool finish_quietly(std::string_view conn, handler_signal s) noexcept;
    // `n` deliveries of `conn` were dropped without running their handlers (the connection can no longer
    // answer them): as n handler_finished() calls without a backoff signal.
    rdy_output deliveries_dropped(std::string_view conn, unsigned n, clock::time_point now);
    // A timer armed through an output fired (a stale expiry must be filtered by the caller).
    rdy_output timer_fired(rdy_timer t, clock::time_point now);
    rdy_output set_max_in_flight(unsigned n, clock::time_point now);
    // Drain: RDY 0 on every connection; from now on nothing but connection_removed changes state and no
    // command comes out.
    rdy_output stop();

    unsigned rdy(const std::string& conn) const;  // last RDY sent (0 when unknown)
    std::uint64_t total_sent() const;             // sum of RDY sent now
    std::uint64_t committed_total() const;        // what nsqd may still be applying
    std::uint64_t max_committed_total() const noexcept { return max_committed_; }
    std::uint64_t pending() const noexcept { return pending_; }  // messages whose handler has not finished
    std::uint64_t orphans() const noexcept { return orphans_; }  // … of them from connections that ended
    unsigned outstanding(const std::string& conn) const;         // … of them from `conn`
    std::size_t connections() const noexcept { return conns_.size(); }
    bool backing_off() const noexcept { return backoff_.backing_off(); }
    int backoff_level() const noexcept { return backoff_.level(); }
    unsigned max_in_flight() const noexcept { return s_.max_in_flight; }

  private:
    struct conn_state {
        unsigned sent = 0;       // last RDY written
        unsigned committed = 0;  // what nsqd may still be applying: max(sent, a recent higher value)
        unsigned remaining = 0;  // messages still allowed by the last RDY (go-nsq's "remain")
        unsigned target = 0;     // what the last plan wants (applied as the budget allows)
        unsigned max_rdy = 0;
        unsigned outstanding = 0;  // deliveries received here whose handler has not finished
        clock::time_point last_active{};
        std::optional<clock::time_point> settles_at;  // when committed may drop to sent (after a decrease)
    };

    void set_rdy(rdy_output& out, const std::string& key, conn_state& c, unsigned n, clock::time_point now);
    void arm(rdy_output& out, rdy_timer t, milliseconds after);
    void schedule_settle(rdy_output& out, clock::time_point now);
    void rebalance(rdy_output& out, clock::time_point now, bool recompute = true);
    void act(rdy_output& out, backoff_policy::decision d, clock::time_point now);
    void keep_backoff_going(rdy_output& out);
    void resume_one(rdy_output& out, clock::time_point now);
    void note_committed();
    // What `c` may still hold: nsqd sends while its in-flight count is below RDY.
    static std::uint64_t load(const conn_state& c) noexcept { return std::max(c.committed, c.outstanding); }
    std::uint64_t total_load() const noexcept;  // Σ load + orphans
    // Takes `n` finished (or dropped) deliveries off the counts.
    void take_finished(std::string_view conn, unsigned n) noexcept;
    bool would_free(std::string_view conn) const noexcept;
    bool held_back() const noexcept;  // a connection's planned RDY is above what it was sent

    rdy_settings s_;
    backoff_policy backoff_;
    std::map<std::string, conn_state, std::less<>> conns_;  // ordered: plans are reproducible
    std::array<bool, rdy_timer_count> armed_{};
    std::size_t rr_cursor_ = 0, trial_cursor_ = 0;
    std::uint64_t pending_ = 0, max_committed_ = 0;
    std::uint64_t orphans_ = 0;  // outstanding deliveries of connections already removed
    bool stopping_ = false;
};

}  // namespace cg::nsq
