// The consumer's RDY/backoff controller against a simulated nsqd view and clock (rdy_sim.hpp): the RDY budget
// across connections that come and go, max_in_flight below the connection count or changed, the settle
// delay, the re-send when low, a read's batch. Backoff is rdy_backoff_test.cpp, deliveries still in hand
// rdy_deliveries_test.cpp.
#include <boost/test/unit_test.hpp>

#include "rdy_sim.hpp"

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
