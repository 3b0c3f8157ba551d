// stripe::rate_control: the calibration after a slow start — where the slow start ends, the estimate lowered
// by a step, a lowered limit measured, a raised one reclaimed from memory and then forgotten (simulated time
// against a server-side token bucket, no I/O).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <deque>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/unit/stripe/rate_control_sim.hpp"

BOOST_AUTO_TEST_SUITE(rate_control_suite)

struct driven {
    int ok = 0, throttled = 0;
};
driven drive(rate_control& rc, server_bucket& account, tp from, std::chrono::milliseconds span,
             int per_ms = 50) {
    driven d;
    std::deque<std::tuple<tp, bool, tp>> pending;
    for (auto t = from; t < from + span; t += 1ms) {
        for (; !pending.empty() && std::get<0>(pending.front()) <= t; pending.pop_front())
            rc.on_response(t, !std::get<1>(pending.front()), std::get<2>(pending.front()));
        for (int n = 0; n < per_ms && rc.try_take(t); ++n) {
            bool a = account.take(t);
            pending.emplace_back(t + 5ms, a, t);
            (a ? d.ok : d.throttled)++;
        }
    }
    for (auto& [at, a, sent] : pending) rc.on_response(at, !a, sent);
    return d;
}

// The first 429 of the slow start ends it at slow_start_exit × the accepted rate (that rate includes the
// drain of Stripe's full bucket and the doubling's overshoot), then the limit grows as
// e^(calibrate_growth · t) under pressure until the next 429, which measures the rate between the two.
BOOST_AUTO_TEST_CASE(slow_start_ends_at_half_then_calibrates_until_the_next_429) {
    rate_config c;  // 10/s, doubling every 250 ms
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0};
    auto d = drive(rc, account, t0, 1500ms);
    BOOST_TEST_REQUIRE(rc.decreases() >= 1u);
    BOOST_TEST(!rc.in_slow_start());
    BOOST_TEST(d.throttled > 0);
    // Half of what it accepted, which the full bucket's drain and the doubling's overshoot inflated.
    BOOST_TEST(rc.estimate() <= 25.0);
    BOOST_TEST(rc.estimate() >= 0.5 * 25.0);
    // Pressed for 1 s more without a 429 (a bucket that refuses nothing): × e^0.3.
    server_bucket open{1000, 1000, 1000, t0 + 1500ms};
    std::uint64_t before = rc.decreases();
    double l1 = rc.limit();
    (void)drive(rc, open, t0 + 1500ms, 1000ms);
    BOOST_TEST(rc.decreases() == before);
    BOOST_TEST(rc.limit() / l1 == std::exp(c.calibrate_growth), boost::test_tools::tolerance(0.03));
}

// A sidecar that waited 10 s for its first request (started before the work came): its first rate window
// spans the wait, which says nothing of the rate Stripe accepts once requests flow, so the slow start ends
// at half of what was accepted (as without the wait), not at the floor.
BOOST_AUTO_TEST_CASE(a_slow_start_after_a_wait_ends_from_the_rate_accepted_not_the_floor) {
    rate_config c;  // 10/s, doubling every 250 ms
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0 + 10s};
    (void)drive(rc, account, t0 + 10s, 1500ms);
    BOOST_TEST_REQUIRE(rc.decreases() >= 1u);
    BOOST_TEST(!rc.in_slow_start());
    BOOST_TEST(rc.estimate() >= 0.4 * 25);
    BOOST_TEST(rc.limit() >= 0.4 * 25 * c.decrease_factor);
}

// Not probing (at its estimate) a sidecar answered since its last 429 gets one: another sender's probe or
// a lowered limit. One such episode lowers the estimate by at most victim_step; with nothing answered
// since, the estimate follows what was accepted.
BOOST_AUTO_TEST_CASE(a_429_while_not_probing_lowers_the_estimate_by_a_step) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    auto t = t0;
    for (int i = 0; i < 100; ++i, t += 40ms) {  // 25/s for 4 s
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false, t);
    }
    rc.on_response(t, true, t);
    BOOST_TEST_REQUIRE(rc.estimate() == 25.0, boost::test_tools::tolerance(0.03));
    // 3 s at 10/s (in the dip, below the estimate), then a 429: measured 10/s, but one step at most.
    for (int i = 0; i < 30; ++i) {
        t += 100ms;
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false, t);
    }
    BOOST_TEST_REQUIRE(rc.limit() <= rc.estimate());
    double before = rc.estimate();
    rc.on_response(t + 1ms, true, t);
    BOOST_TEST(rc.estimate() == before * (1 - c.victim_step), boost::test_tools::tolerance(0.001));
}

// A 429 episode while demand did not reach the limit (an injected or transient 429, another sender) was not
// this process's rate emptying Stripe's bucket: the limit drops as for any episode, then doubles back under
// pressure every slow_start_step, as in the slow start, instead of climbing back over `recover` and probing
// past an estimate measured at the demand's rate.
BOOST_AUTO_TEST_CASE(a_429_while_demand_was_below_the_limit_doubles_back_under_pressure) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0};
    (void)drive(rc, account, t0, 30s);  // pressed at Stripe's 25/s
    BOOST_TEST_REQUIRE(!rc.rebounding());
    auto t = t0 + 30s + 250ms;
    for (int i = 0; i < 20; ++i, t += 250ms) {  // 4/s for 5 s: below the limit, nothing waits
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t + 5ms, false, t);
    }
    BOOST_TEST_REQUIRE(rc.try_take(t));
    rc.on_response(t + 5ms, true, t);
    BOOST_TEST(rc.rebounding());
    double dipped = rc.limit();
    server_bucket open{1000, 1000, 1000, t + 10ms};
    (void)drive(rc, open, t + 10ms, 1000ms);  // a backlog, nothing refused: four doublings in a second
    BOOST_TEST(rc.limit() >= 8 * dipped);
    // Pressed when the next 429 comes: an ordinary episode again.
    t += 2s;
    while (rc.try_take(t)) {
    }
    rc.on_response(t + 5ms, true, t);
    BOOST_TEST(!rc.rebounding());
}

// A limit Stripe lowers: the 429s come close together and what Stripe accepted since the first of them is
// its new rate; the estimate is there within about a second, not one step per episode.
BOOST_AUTO_TEST_CASE(a_lowered_limit_is_measured_within_a_second) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0};
    (void)drive(rc, account, t0, 30s);
    BOOST_TEST_REQUIRE(rc.estimate() == 25.0, boost::test_tools::tolerance(0.1));
    auto t = t0 + 30s;
    account.set(15, t);
    (void)drive(rc, account, t, 3s);
    BOOST_TEST(rc.estimate() == 15.0, boost::test_tools::tolerance(0.1));
}

// After a lowered limit the controller remembers the higher rate for `recall`: it holds at
// reclaim_hold_factor × its estimate for 1 / (reclaim_budget × estimate) seconds, then climbs to the
// remembered rate in `reclaim`; a limit raised back is found within a few seconds, and the 429s of the
// attempts stay within about reclaim_budget of the requests.
BOOST_AUTO_TEST_CASE(a_limit_raised_back_is_reclaimed_from_memory) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0};
    (void)drive(rc, account, t0, 30s);
    auto t = t0 + 30s;
    account.set(15, t);
    (void)drive(rc, account, t, 10s);
    t += 10s;
    BOOST_TEST_REQUIRE(rc.recalled() == 25.0, boost::test_tools::tolerance(0.1));
    BOOST_TEST_REQUIRE(rc.estimate() == 15.0, boost::test_tools::tolerance(0.1));
    auto low = drive(rc, account, t, 20s);  // attempts at the lowered limit
    t += 20s;
    double share = double(low.throttled) / double(low.ok + low.throttled);
    BOOST_TEST(share < 2 * c.reclaim_budget);
    BOOST_TEST(low.ok >= 0.97 * 15 * 20);
    account.set(25, t);
    auto back = drive(rc, account, t, 5s);  // the hold, the climb, then at the limit
    // Stripe's bucket, full after the hold, hides the raised limit until the climb past it drains the
    // bucket; the 429 that then measures it costs one dip, so the next 10 s average at least 90 %.
    auto after = drive(rc, account, t + 5s, 10s);
    BOOST_TEST(back.ok >= 15 * 5 + 10);
    BOOST_TEST(after.ok >= 0.9 * 25 * 10);
    BOOST_TEST(back.throttled + after.throttled <= 3);
    BOOST_TEST(rc.estimate() >= 0.95 * 25);
}

// The remembered rate is forgotten once `recall` passes without an estimate near it: a limit lowered for
// good stops being probed for its old value.
BOOST_AUTO_TEST_CASE(the_remembered_rate_is_forgotten_after_recall) {
    rate_config c;
    c.initial_rps = 0;
    c.recall = 20000ms;
    rate_control rc(c, t0);
    server_bucket account{25, 25, 25, t0};
    (void)drive(rc, account, t0, 30s);
    auto t = t0 + 30s;
    BOOST_TEST_REQUIRE(rc.recalled() == 25.0, boost::test_tools::tolerance(0.1));
    account.set(15, t);
    (void)drive(rc, account, t, 40s);
    BOOST_TEST(rc.recalled() < 17.0);
    // Without the memory the 429s at the lowered limit are the steady probe's, well under the budget.
    auto later = drive(rc, account, t + 40s, 30s);
    BOOST_TEST(double(later.throttled) / double(later.ok + later.throttled) < 0.01);
}

BOOST_AUTO_TEST_SUITE_END()
