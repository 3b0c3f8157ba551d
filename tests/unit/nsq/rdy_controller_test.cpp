// The consumer's RDY/backoff controller, driven by event tables against a simulated nsqd view and clock:
// the controller's RDY commands are applied to per-connection histories, its timer requests fire when the
// simulated clock reaches them. The RDY budget is checked independently of the controller's own
// bookkeeping: a lowered RDY counts at its old value until settle_delay has passed (nsqd may not have
// applied it yet), and that sum must never exceed max_in_flight. Nor may what nsqd could have handed the
// consumer at once: nsqd sends on a connection while its in-flight count is below RDY, so a connection
// can hold max(RDY, deliveries not yet handled there), and a connection that dropped still holds its
// deliveries until their handlers finish.
#include "nsq/rdy_controller.hpp"

#include <boost/test/unit_test.hpp>
#include <deque>
#include <map>
#include <optional>
#include <set>

using namespace cg::nsq;
using namespace std::chrono;
using note_kind = rdy_output::note_kind;

namespace {

rdy_settings settings(unsigned mif) {
    rdy_settings s;
    s.max_in_flight = mif;
    s.low_rdy_idle_timeout = seconds(10);
    s.settle_delay = milliseconds(100);
    s.redistribute_interval = seconds(5);
    s.backoff_multiplier = seconds(1);
    s.max_backoff = seconds(120);
    return s;
}

struct sim {
    explicit sim(unsigned mif) : s(settings(mif)), c(s) { take(c.start()); }

    rdy_settings s;
    rdy_controller c;
    clock::time_point now = clock::time_point{} + hours(1);
    std::map<rdy_timer, clock::time_point> due;
    struct sent {
        clock::time_point at;
        unsigned n;
    };
    std::map<std::string, std::vector<sent>> history;  // live connections only
    std::vector<rdy_output::note> notes;
    std::vector<rdy_output::rdy_command> last_rdy;  // of the last event
    std::uint64_t budget_violations = 0;
    std::uint64_t peak_effective = 0;
    // Deliveries received and not finished, oldest first, by connection ("" once it dropped).
    std::deque<std::string> deliveries;
    std::uint64_t outstanding_violations = 0;
    std::uint64_t peak_load = 0;

    unsigned rdy(const std::string& k) const {
        auto it = history.find(k);
        return it == history.end() || it->second.empty() ? 0 : it->second.back().n;
    }
    unsigned total() const {
        unsigned t = 0;
        for (const auto& [k, h] : history) t += h.empty() ? 0 : h.back().n;
        return t;
    }
    // What nsqd may be applying on `k`: the value in effect for sure (sent ≥ settle_delay ago) or anything
    // sent since, whichever is larger.
    unsigned effective(const std::string& k) const {
        unsigned before = 0, recent = 0;
        for (const auto& r : history.at(k)) {
            if (now - r.at >= s.settle_delay) {
                before = r.n;
            } else {
                recent = std::max(recent, r.n);
            }
        }
        return std::max(before, recent);
    }
    unsigned with_rdy() const {
        unsigned n = 0;
        for (const auto& [k, h] : history) n += !h.empty() && h.back().n > 0;
        return n;
    }
    std::uint64_t held(const std::string& k) const {
        return static_cast<std::uint64_t>(std::count(deliveries.begin(), deliveries.end(), k));
    }
    void check() {
        std::uint64_t eff = 0, load = held("");
        for (const auto& [k, h] : history) {
            eff += effective(k);
            load += std::max<std::uint64_t>(effective(k), held(k));
        }
        peak_effective = std::max(peak_effective, eff);
        if (eff > c.max_in_flight()) ++budget_violations;
        peak_load = std::max(peak_load, load);
        if (load > c.max_in_flight()) ++outstanding_violations;
    }
    void take(const rdy_output& o) {
        last_rdy = o.rdy;
        for (const auto& r : o.rdy) {
            BOOST_TEST_REQUIRE(history.contains(r.conn), "RDY for a connection that is not live: " << r.conn);
            history[r.conn].push_back({now, r.count});
        }
        for (const auto& t : o.timers) due[t.which] = now + t.after;
        notes.insert(notes.end(), o.notes.begin(), o.notes.end());
        check();
    }
    bool armed(rdy_timer t) const { return due.contains(t); }
    bool noted(note_kind k) const {
        for (const auto& n : notes)
            if (n.kind == k) return true;
        return false;
    }

    void add(const std::string& k, unsigned max_rdy = 2500) {
        history[k];
        take(c.connection_added(k, max_rdy, now));
    }
    void remove(const std::string& k) {
        history.erase(k);
        for (auto& d : deliveries)
            if (d == k) d.clear();
        take(c.connection_removed(k, now));
    }
    // A delivery arrives as nsqd would send it: only while the connection's in-flight count is below RDY.
    void receive(const std::string& k) {
        deliveries.push_back(k);
        c.message_received(k, now);
        check();
    }
    bool can_receive(const std::string& k) const { return held(k) < rdy(k); }
    // The oldest delivery's handler finishes.
    void finish(handler_signal sig) {
        BOOST_TEST_REQUIRE(!deliveries.empty());
        auto k = deliveries.front();
        deliveries.pop_front();
        take(c.handler_finished(k, sig, now));
    }
    bool finish_quietly(handler_signal sig) {
        BOOST_TEST_REQUIRE(!deliveries.empty());
        if (!c.finish_quietly(deliveries.front(), sig)) return false;
        deliveries.pop_front();
        check();
        return true;
    }
    // Moves the clock on, firing every timer that falls due on the way (in order).
    void advance(clock::duration d) {
        auto until = now + d;
        for (;;) {
            std::optional<std::pair<rdy_timer, clock::time_point>> next;
            for (const auto& [t, at] : due)
                if (at <= until && (!next || at < next->second)) next = {t, at};
            if (!next) break;
            due.erase(next->first);
            now = std::max(now, next->second);
            check();
            take(c.timer_fired(next->first, now));
        }
        now = until;
        check();
    }
};

std::string key(unsigned i) {
    return "10.0.0." + std::to_string(i) + ":4150";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(rdy_controller_tests)

// Connections come and go one at a time; after every step and while the timers run, the RDY nsqd may be
// applying stays within max_in_flight; once settled, the budget is used: every connection has RDY ≥ 1 and
// the total is max_in_flight (n ≤ max_in_flight), or exactly max_in_flight connections hold RDY 1.
BOOST_AUTO_TEST_CASE(rdy_never_above_max_in_flight_across_n_connections) {
    struct row {
        unsigned conns, mif;
    };
    const row rows[] = {{1, 1}, {1, 2500}, {2, 1},  {2, 3},  {3, 10},  {3, 2500},
                        {5, 2}, {5, 5},    {7, 20}, {10, 3}, {10, 10}, {50, 7}};
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("conns=" << r.conns << " mif=" << r.mif) {
            sim s(r.mif);
            for (unsigned i = 0; i < r.conns; ++i) {
                s.add(key(i));
                s.advance(milliseconds(10));
            }
            s.advance(seconds(1));
            BOOST_TEST(s.budget_violations == 0u);
            if (r.conns <= r.mif) {
                BOOST_TEST(s.total() == r.mif);
                for (unsigned i = 0; i < r.conns; ++i) BOOST_TEST(s.rdy(key(i)) >= 1u);
            } else {
                BOOST_TEST(s.total() == r.mif);
                BOOST_TEST(s.with_rdy() == r.mif);
            }
            // Half of them drop, then come back: the budget is redistributed, never exceeded.
            for (unsigned i = 0; i < r.conns; i += 2) {
                s.remove(key(i));
                s.advance(milliseconds(5));
            }
            s.advance(seconds(1));
            unsigned left = r.conns - (r.conns + 1) / 2;
            if (left > 0) BOOST_TEST(s.total() == r.mif);
            for (unsigned i = 0; i < r.conns; i += 2) {
                s.add(key(i));
                s.advance(milliseconds(3));
            }
            s.advance(seconds(1));
            BOOST_TEST(s.total() == r.mif);
            BOOST_TEST(s.budget_violations == 0u);
            BOOST_TEST(s.peak_effective <= r.mif);
            BOOST_TEST(s.c.max_committed_total() <= r.mif);
        }
    }
}

// More connections than max_in_flight: RDY 1 moves on from idle holders at the redistribute interval, so
// every connection gets a turn, and the budget holds while it moves.
BOOST_AUTO_TEST_CASE(redistributes_rdy_1_when_max_in_flight_is_below_the_connection_count) {
    sim s(2);
    for (unsigned i = 0; i < 6; ++i) s.add(key(i));
    s.advance(seconds(1));
    BOOST_TEST(s.with_rdy() == 2u);
    std::set<std::string> holders;
    for (int round = 0; round < 12; ++round) {
        for (const auto& [k, h] : s.history)
            if (s.rdy(k) > 0) holders.insert(k);
        s.advance(seconds(11));  // nothing arrives: holders go idle, RDY moves on
        BOOST_TEST(s.total() <= 2u);
    }
    BOOST_TEST(holders.size() == 6u);
    BOOST_TEST(s.budget_violations == 0u);
    // A busy holder keeps its RDY 1.
    std::string busy;
    for (const auto& [k, h] : s.history)
        if (s.rdy(k) > 0) busy = k;
    for (int i = 0; i < 6; ++i) {
        s.advance(seconds(5));
        s.receive(busy);
        s.finish(handler_signal::success);
        BOOST_TEST(s.rdy(busy) == 1u);
    }
}

BOOST_AUTO_TEST_CASE(max_in_flight_changes_are_applied_within_the_budget) {
    struct row {
        unsigned conns, from, to;
    };
    const row rows[] = {{4, 100, 2}, {4, 100, 4}, {4, 2, 100}, {3, 10, 1}, {1, 2500, 10}, {6, 6, 3}};
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("conns=" << r.conns << " " << r.from << "→" << r.to) {
            sim s(r.from);
            for (unsigned i = 0; i < r.conns; ++i) s.add(key(i));
            s.advance(seconds(1));
            BOOST_TEST(s.total() == r.from);
            // Checked against the larger budget while nsqd may still apply the old values, then the new.
            s.take(s.c.set_max_in_flight(r.to, s.now));
            s.advance(s.s.settle_delay);
            s.budget_violations = 0;
            s.advance(seconds(1));
            BOOST_TEST(s.total() == r.to);
            BOOST_TEST(s.with_rdy() == std::min(r.conns, r.to));
            BOOST_TEST(s.budget_violations == 0u);
        }
    }
}

// A raise is only handed out once the decrease elsewhere had settle_delay to reach nsqd.
BOOST_AUTO_TEST_CASE(freed_budget_waits_for_the_settle_delay) {
    sim s(10);
    s.add(key(0));
    BOOST_TEST(s.rdy(key(0)) == 10u);
    s.add(key(1));  // key(0) must go down to 5 now, key(1) may only use what is surely free
    BOOST_TEST(s.rdy(key(0)) == 5u);
    BOOST_TEST(s.rdy(key(1)) == 0u);
    BOOST_TEST(s.armed(rdy_timer::settle));
    s.advance(milliseconds(99));
    BOOST_TEST(s.rdy(key(1)) == 0u);
    s.advance(milliseconds(1));
    BOOST_TEST(s.rdy(key(1)) == 5u);
    BOOST_TEST(s.budget_violations == 0u);
}

// go-nsq's "re-send when low": once fewer than a quarter of the last RDY remain, the same RDY again.
BOOST_AUTO_TEST_CASE(rdy_is_resent_when_the_remaining_count_runs_low) {
    sim s(100);
    s.add(key(0));
    BOOST_TEST(s.rdy(key(0)) == 100u);
    for (int i = 0; i < 75; ++i) s.receive(key(0));
    s.take(s.c.read_batch_done(key(0)));
    BOOST_TEST(s.last_rdy.empty());  // 25 left: not below a quarter yet
    s.receive(key(0));
    s.take(s.c.read_batch_done(key(0)));
    BOOST_TEST((s.last_rdy == std::vector<rdy_output::rdy_command>{{key(0), 100}}));
    s.take(s.c.read_batch_done(key(0)));
    BOOST_TEST(s.last_rdy.empty());  // reset to the full count
}

// The consumer reports a read's messages in one call: the same RDY re-send points and pending count as
// one call per message, and a count past the remaining RDY stops at 0.
BOOST_AUTO_TEST_CASE(a_read_batch_counts_like_its_messages_one_by_one) {
    sim one(100), batch(100);
    one.add(key(0));
    batch.add(key(0));
    for (unsigned n : {10u, 65u, 1u, 30u, 200u, 0u, 99u}) {
        for (unsigned i = 0; i < n; ++i) one.receive(key(0));
        batch.c.messages_received(key(0), n, batch.now);
        one.take(one.c.read_batch_done(key(0)));
        batch.take(batch.c.read_batch_done(key(0)));
        BOOST_TEST((one.last_rdy == batch.last_rdy));
        BOOST_TEST(one.c.pending() == batch.c.pending());
    }
    BOOST_TEST(batch.c.pending() == 405u);
    BOOST_TEST(batch.c.outstanding(key(0)) == 405u);
    // finish_quietly() is handler_finished() for a quiet result: one pending message less.
    BOOST_TEST(batch.c.finish_quietly(key(0), handler_signal::success));
    one.finish(handler_signal::success);
    BOOST_TEST(one.c.pending() == batch.c.pending());
    BOOST_TEST(batch.c.pending() == 404u);
    BOOST_TEST(batch.c.outstanding(key(0)) == 404u);
}

// The stall: the connection holding the trial RDY 1 drops while the consumer backs off, with no
// handler running. The controller must arm the backoff timer again and send a new trial elsewhere.
BOOST_AUTO_TEST_CASE(backoff_re_arms_when_the_trial_connection_drops) {
    sim s(10);
    s.add(key(0));
    s.add(key(1));
    s.advance(seconds(1));
    BOOST_TEST(s.total() == 10u);

    s.receive(key(0));
    s.finish(handler_signal::failure);
    BOOST_TEST(s.c.backing_off());
    BOOST_TEST(s.noted(note_kind::backoff_started));
    BOOST_TEST(s.total() == 0u);
    BOOST_TEST(s.armed(rdy_timer::backoff));

    s.advance(seconds(2));  // level 1: 2 s → trial RDY 1 on one connection
    BOOST_TEST(s.noted(note_kind::trial));
    BOOST_TEST(s.total() == 1u);
    std::string trial = s.rdy(key(0)) == 1 ? key(0) : key(1);
    std::string other = trial == key(0) ? key(1) : key(0);
    BOOST_TEST(!s.armed(rdy_timer::backoff));

    s.remove(trial);  // no message came, no handler pending
    BOOST_TEST(s.noted(note_kind::trial_lost));
    BOOST_TEST(s.armed(rdy_timer::backoff), "nothing re-armed the backoff: RDY 0 for ever");
    BOOST_TEST(s.total() == 0u);

    s.advance(seconds(2));
    BOOST_TEST(s.rdy(other) == 1u);  // a new trial on the connection left
    s.receive(other);
    s.finish(handler_signal::success);
    BOOST_TEST(!s.c.backing_off());
    BOOST_TEST(s.noted(note_kind::backoff_ended));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(other) == 10u);
    BOOST_TEST(s.budget_violations == 0u);
}

// The same drop with the trial's message still being handled: its result decides the next step, so no
// re-arm yet; a failure then backs off again with the timer armed.
BOOST_AUTO_TEST_CASE(backoff_waits_for_a_pending_handler_before_re_arming) {
    sim s(4);
    s.add(key(0));
    s.receive(key(0));
    s.finish(handler_signal::failure);
    s.advance(seconds(2));
    BOOST_TEST(s.rdy(key(0)) == 1u);
    s.receive(key(0));
    s.remove(key(0));
    BOOST_TEST(!s.armed(rdy_timer::backoff));
    BOOST_TEST(!s.noted(note_kind::trial_lost));
    s.finish(handler_signal::failure);
    BOOST_TEST(s.armed(rdy_timer::backoff));
    BOOST_TEST(s.c.backoff_level() == 2);
    // No connection at all when the timer fires: it keeps trying every second until one is back.
    s.advance(seconds(4));
    BOOST_TEST(s.armed(rdy_timer::backoff));
    s.add(key(1));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(key(1)) == 1u);
}

// A backoff signal table: the level after a sequence of handler results, and whether RDY is full again.
BOOST_AUTO_TEST_CASE(backoff_levels_follow_handler_results) {
    using hs = handler_signal;
    struct row {
        std::vector<hs> signals;  // each after the backoff timer fired and a trial message arrived
        int level;
    };
    const row rows[] = {
        {{hs::failure}, 1},
        {{hs::failure, hs::failure}, 2},
        {{hs::failure, hs::success}, 0},
        {{hs::failure, hs::failure, hs::success}, 1},
        {{hs::failure, hs::neutral}, 1},
        {{hs::neutral}, 0},
        {{hs::success}, 0},
    };
    for (const auto& r : rows) {
        sim s(8);
        s.add(key(0));
        s.add(key(1));
        for (auto sig : r.signals) {
            s.advance(minutes(5));  // any backoff timer fired: a trial (or full) RDY is out
            auto holder = s.rdy(key(0)) > 0 ? key(0) : key(1);
            s.receive(holder);
            s.finish(sig);
        }
        BOOST_TEST(s.c.backoff_level() == r.level);
        s.advance(milliseconds(500));
        BOOST_TEST(s.total() == (r.level == 0 ? 8u : 0u));
        BOOST_TEST(s.budget_violations == 0u);
    }
}

// Signals from messages already in flight during a backoff timeout do not move the level.
BOOST_AUTO_TEST_CASE(signals_during_a_backoff_timeout_are_ignored) {
    sim s(8);
    s.add(key(0));
    for (int i = 0; i < 5; ++i) s.receive(key(0));
    s.finish(handler_signal::failure);
    for (int i = 0; i < 4; ++i) s.finish(handler_signal::failure);
    BOOST_TEST(s.c.backoff_level() == 1);
    BOOST_TEST(s.total() == 0u);
}

BOOST_AUTO_TEST_CASE(stop_sends_rdy_0_everywhere_then_stays_quiet) {
    sim s(6);
    s.add(key(0));
    s.add(key(1));
    s.advance(seconds(1));
    s.receive(key(0));
    auto out = s.c.stop();
    BOOST_TEST(out.rdy.size() == 2u);
    s.take(out);
    BOOST_TEST(s.total() == 0u);
    s.finish(handler_signal::failure);
    BOOST_TEST(s.last_rdy.empty());
    BOOST_TEST(s.c.timer_fired(rdy_timer::redistribute, s.now).empty());
    BOOST_TEST(s.c.connection_added(key(2), 2500, s.now).empty());
    BOOST_TEST(s.c.read_batch_done(key(1)).empty());
    BOOST_TEST(s.c.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(a_timer_not_armed_is_ignored) {
    rdy_controller c(settings(4));
    BOOST_TEST(c.timer_fired(rdy_timer::backoff, clock::now()).empty());
    BOOST_TEST(c.timer_fired(rdy_timer::settle, clock::now()).empty());
    BOOST_TEST(c.timer_fired(rdy_timer::redistribute, clock::now()).empty());
    auto out = c.start();
    BOOST_TEST(out.timers.size() == 1u);
    BOOST_TEST(!c.timer_fired(rdy_timer::redistribute, clock::now()).timers.empty());  // re-armed
}

// Lets every connection take what nsqd would send it now (in-flight below RDY), round-robin, at most
// `limit` messages.
void deliver_all(sim& s, unsigned limit = ~0u) {
    for (bool any = true; any && limit > 0;) {
        any = false;
        std::vector<std::string> keys;
        for (const auto& [k, h] : s.history) keys.push_back(k);
        for (const auto& k : keys)
            if (limit > 0 && s.can_receive(k)) {
                s.receive(k);
                --limit;
                any = true;
            }
    }
}

// The review's first scenario: B joins while A has max_in_flight deliveries in hand (handlers running).
// Lowering A's RDY does not take those back, so B may only get RDY as A's handlers finish; messages nsqd
// keeps sending stay within max_in_flight throughout, and in the end both share the budget.
BOOST_AUTO_TEST_CASE(a_joining_connection_waits_for_the_deliveries_still_in_hand_elsewhere) {
    for (unsigned mif : {1u, 2u, 3u, 10u, 100u, 2500u}) {
        BOOST_TEST_CONTEXT("mif=" << mif) {
            sim s(mif);
            s.add(key(0));
            s.advance(milliseconds(200));
            deliver_all(s);
            BOOST_TEST(s.held(key(0)) == mif);
            s.add(key(1));
            s.advance(seconds(1));  // settle delay, redistribute timer
            deliver_all(s);
            BOOST_TEST(s.rdy(key(1)) == 0u, "RDY given while key(0) still holds max_in_flight");
            BOOST_TEST(s.c.pending() == mif);
            // Handlers finish one by one while nsqd keeps sending (2 × max_in_flight more messages).
            unsigned more = 2 * mif;
            while (!s.deliveries.empty()) {
                s.finish(handler_signal::success);
                s.advance(milliseconds(30));
                auto before = s.deliveries.size();
                deliver_all(s, more);
                more -= static_cast<unsigned>(s.deliveries.size() - before);
            }
            s.advance(seconds(1));
            BOOST_TEST(s.total() == mif);
            if (mif >= 2) BOOST_TEST(s.rdy(key(1)) >= 1u);
            BOOST_TEST(s.outstanding_violations == 0u);
            BOOST_TEST(s.peak_load <= mif);
            BOOST_TEST(s.budget_violations == 0u);
        }
    }
}

// The second: A drops with its handlers still running and B is the only connection left. A's deliveries
// keep their share until their handlers finish (their FINs are lost, nsqd redelivers later): B's RDY
// grows by one per finished orphan, not at once to max_in_flight.
BOOST_AUTO_TEST_CASE(a_dropped_connections_running_deliveries_keep_their_budget_until_finished) {
    for (unsigned mif : {2u, 4u, 10u, 101u}) {
        BOOST_TEST_CONTEXT("mif=" << mif) {
            sim s(mif);
            s.add(key(0));
            s.add(key(1));
            s.advance(seconds(1));
            deliver_all(s);  // each holds its share
            BOOST_TEST(s.held(key(0)) + s.held(key(1)) == mif);
            auto a = s.held(key(0));
            s.remove(key(0));
            BOOST_TEST(s.c.orphans() == a);
            s.advance(seconds(1));
            deliver_all(s);
            BOOST_TEST(s.rdy(key(1)) == mif - a, "the orphans' share handed out while they still run");
            // The orphans finish first (oldest first in the sim: key(0)'s came first? not necessarily).
            while (s.c.orphans() > 0) {
                auto it = std::find(s.deliveries.begin(), s.deliveries.end(), std::string());
                BOOST_REQUIRE((it != s.deliveries.end()));
                s.deliveries.erase(it);
                s.take(s.c.handler_finished({}, handler_signal::success, s.now));
                deliver_all(s);
            }
            BOOST_TEST(s.rdy(key(1)) == mif);
            BOOST_TEST(s.outstanding_violations == 0u);
            BOOST_TEST(s.peak_load <= mif);
        }
    }
}

// The per-message fast path declines exactly when a finished delivery frees budget a connection waits
// for; the full path then raises that connection's RDY.
BOOST_AUTO_TEST_CASE(finishing_quietly_is_declined_when_a_connection_waits_for_the_budget) {
    sim s(4);
    s.add(key(0));
    deliver_all(s);  // 4 in hand on key(0)
    s.add(key(1));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(key(0)) == 2u);
    BOOST_TEST(s.rdy(key(1)) == 0u);
    BOOST_TEST(!s.finish_quietly(handler_signal::success));  // key(0) holds 4 > its RDY 2: frees one
    s.finish(handler_signal::success);
    BOOST_TEST(s.rdy(key(1)) == 1u);
    s.finish(handler_signal::success);
    BOOST_TEST(s.rdy(key(1)) == 2u);                        // the plan is met
    BOOST_TEST(s.finish_quietly(handler_signal::success));  // 2 in hand at RDY 2: frees nothing
    BOOST_TEST(s.finish_quietly(handler_signal::success));
    BOOST_TEST(s.outstanding_violations == 0u);
}

// Deliveries dropped without a handler (their connection ended) free their share like finished ones,
// without a backoff signal; a backoff whose only pending messages were dropped is kept moving.
BOOST_AUTO_TEST_CASE(dropped_deliveries_free_their_share_and_keep_a_backoff_moving) {
    sim s(2);
    s.add(key(0));
    deliver_all(s);
    s.add(key(1));
    s.remove(key(0));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(key(1)) == 0u);
    s.deliveries.clear();
    s.take(s.c.deliveries_dropped({}, 2, s.now));
    BOOST_TEST(s.rdy(key(1)) == 2u);
    BOOST_TEST(s.c.pending() == 0u);
    BOOST_TEST(!s.c.backing_off());
    // In backoff with the trial's delivery outstanding when its connection drops: once it is dropped,
    // nothing is under way, so the backoff timer is armed again.
    s.receive(key(1));
    s.finish(handler_signal::failure);
    s.advance(seconds(3));
    BOOST_TEST(s.rdy(key(1)) == 1u);  // the trial
    s.receive(key(1));
    s.remove(key(1));
    BOOST_TEST(!s.armed(rdy_timer::backoff));  // the trial's handler decides the next step …
    s.deliveries.clear();
    s.take(s.c.deliveries_dropped({}, 1, s.now));
    BOOST_TEST(s.armed(rdy_timer::backoff));  // … but it was dropped
}

BOOST_AUTO_TEST_SUITE_END()

// The consumer skips the clock read for quiet results: such a result must not act (nor read the time).
BOOST_AUTO_TEST_CASE(quiet_results_change_nothing) {
    sim s(6);
    s.add(key(0));
    s.add(key(1));
    s.advance(seconds(1));
    s.receive(key(0));
    s.receive(key(0));
    BOOST_TEST(!s.finish_quietly(handler_signal::failure));
    BOOST_TEST(!s.finish_quietly(handler_signal::neutral));
    BOOST_TEST(s.c.pending() == 2u);  // refused: nothing changed
    BOOST_TEST(s.finish_quietly(handler_signal::success));
    BOOST_TEST(s.c.pending() == 1u);
    auto out = s.c.handler_finished(key(0), handler_signal::success, clock::time_point{});
    s.deliveries.pop_front();
    BOOST_TEST(out.empty());
    BOOST_TEST(s.total() == 6u);
    s.receive(key(0));
    s.finish(handler_signal::failure);
    s.receive(key(0));
    BOOST_TEST(!s.finish_quietly(handler_signal::success));  // backing off: a success steps the level down
}
