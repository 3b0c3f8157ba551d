// The consumer's RDY controller with deliveries still in hand (rdy_sim.hpp): what nsqd could send at once
// stays within max_in_flight while a connection joins, drops with handlers running, or finishes quietly,
// and dropped deliveries free their share.
#include <boost/test/unit_test.hpp>

#include "rdy_sim.hpp"

BOOST_AUTO_TEST_SUITE(rdy_controller_tests)

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
