// stripe::rate_control: the hard ceiling, the AIMD limit, the slow start, and three uncoordinated
// controllers sharing one account's limit (simulated time, no I/O). Sidecars sharing their state are
// rate_control_sharing_test.cpp and rate_control_peers_test.cpp, the calibration after a slow start
// rate_control_calibration_test.cpp.
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

BOOST_AUTO_TEST_CASE(nothing_limits_before_a_429_without_a_ceiling_or_slow_start) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    BOOST_TEST(std::isinf(rc.limit()));
    for (int i = 0; i < 10000; ++i) BOOST_TEST_REQUIRE(rc.try_take(t0));
    BOOST_TEST((rc.until_next(t0) == rate_control::clock::duration::zero()));
    rc.on_response(t0 + 1s, false);  // successes alone never start limiting
    BOOST_TEST(std::isinf(rc.limit()));
}

// The hard ceiling, with and without the adaptive part: requests per second over a window.
BOOST_AUTO_TEST_CASE(ceiling_table) {
    struct row {
        double max_rps;
        bool adaptive;
        int lo, hi;  // admissions in 2 s
    };
    const row rows[] = {
        {10, false, 20, 21}, {10, true, 20, 21}, {25, false, 50, 52}, {500, true, 1000, 1026}};
    for (const auto& r : rows) {
        rate_config c;
        c.max_rps = r.max_rps;
        c.adaptive = r.adaptive;
        c.initial_rps = 0;  // no slow start: the ceiling alone
        rate_control rc(c, t0);
        int n = admitted(rc, t0, 2000ms);
        BOOST_TEST_CONTEXT(r.max_rps << " adaptive=" << r.adaptive) {
            BOOST_TEST(n >= r.lo);
            BOOST_TEST(n <= r.hi);
            BOOST_TEST(rc.limit() == r.max_rps);
        }
    }
}

BOOST_AUTO_TEST_CASE(until_next_says_when_the_next_token_is_there) {
    rate_config c;
    c.max_rps = 10;
    c.adaptive = false;
    rate_control rc(c, t0);
    BOOST_TEST(rc.try_take(t0));
    BOOST_TEST(!rc.try_take(t0));
    auto wait = rc.until_next(t0);
    BOOST_TEST(std::chrono::duration<double>(wait).count() == 0.1, boost::test_tools::tolerance(0.001));
    BOOST_TEST(!rc.try_take(t0 + 99ms));
    BOOST_TEST(rc.try_take(t0 + 100ms));
}

// A 429 takes the limit to decrease_factor × the rate Stripe accepted; more 429s within the hold are one
// episode; after the hold another 429 decreases again, from what was accepted since; the ceiling and the
// floor hold.
BOOST_AUTO_TEST_CASE(decrease_table) {
    rate_config c;
    c.initial_rps = 0;
    c.decrease_factor = 0.8;
    c.decrease_hold = 1000ms;
    c.min_rps = 2;
    rate_control rc(c, t0);
    // Send 50/s for 2 s, all accepted.
    auto t = t0;
    for (int i = 0; i < 100; ++i, t += 20ms) {
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false);
    }
    rc.on_response(t, true);
    BOOST_TEST(rc.estimate() == 50.0, boost::test_tools::tolerance(0.05));
    BOOST_TEST(rc.limit() == 40.0, boost::test_tools::tolerance(0.05));
    rc.on_response(t + 500ms, true);  // same episode
    BOOST_TEST(rc.limit() == 40.0, boost::test_tools::tolerance(0.05));
    BOOST_TEST(rc.decreases() == 1u);
    // 2 s at 30/s accepted, then a 429: the estimate is what was accepted since the episode before.
    auto u = t;
    for (int i = 0; i < 60; ++i, u += 33ms) {
        BOOST_TEST_REQUIRE(rc.try_take(u));
        rc.on_response(u, false);
    }
    rc.on_response(u, true);
    BOOST_TEST(rc.decreases() == 2u);
    BOOST_TEST(rc.estimate() == 30.0, boost::test_tools::tolerance(0.05));
    BOOST_TEST(rc.limit() == 24.0, boost::test_tools::tolerance(0.05));
    // The floor: 429s with nothing accepted.
    for (int i = 1; i < 40; ++i) rc.on_response(u + std::chrono::seconds(10 * i), true);
    BOOST_TEST(rc.limit() == 2.0, boost::test_tools::tolerance(0.001));

    rate_config capped = c;
    capped.max_rps = 20;
    rate_control rc2(capped, t0);
    BOOST_TEST(rc2.limit() == 20.0);
    for (int i = 0; i < 100; ++i) {
        auto at = t0 + std::chrono::milliseconds(20 * i);
        if (rc2.try_take(at)) rc2.on_response(at, false);
    }
    rc2.on_response(t0 + 2s, true);
    BOOST_TEST(rc2.limit() <= 16.01);
    for (auto at = t0 + 2s; at < t0 + 600s;
         at += 100ms) {  // demand presses; probing never passes the ceiling
        (void)admitted(rc2, at, 100ms, 10ms);
        rc2.on_response(at + 100ms, false);
    }
    BOOST_TEST(rc2.limit() == 20.0);
}

// After a decrease the limit climbs back to the estimate in `recover` (linearly), then probes past it:
// increase_rps_per_s · t + probe_growth · estimate · t², t seconds past the estimate, and only while demand
// presses on it.
BOOST_AUTO_TEST_CASE(the_limit_climbs_back_then_probes_faster_the_longer_no_429_comes) {
    rate_config c;
    c.initial_rps = 0;
    c.decrease_factor = 0.5;
    c.recover = 4000ms;
    c.probe_growth = 0.01;
    c.increase_rps_per_s = 0.5;
    rate_control rc(c, t0);
    auto t = t0;
    for (int i = 0; i < 40; ++i, t += 50ms) {  // 20/s for 2 s
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false);
    }
    rc.on_response(t, true);
    BOOST_TEST(rc.estimate() == 20.0, boost::test_tools::tolerance(0.05));
    BOOST_TEST(rc.limit() == 10.0, boost::test_tools::tolerance(0.05));
    rc.on_response(t + 1s, false);  // nobody waited: no growth, and the curve's clock stands still
    BOOST_TEST(rc.limit() == 10.0, boost::test_tools::tolerance(0.05));
    auto at = [&](std::chrono::milliseconds pressed) {  // the limit after `pressed` more of pressing demand
        auto from = t + 1s;
        for (auto x = from; x < from + pressed; x += 10ms) {
            while (rc.try_take(x)) {
            }
            rc.on_response(x + 10ms, false);
        }
        t += pressed;
        return rc.limit();
    };
    BOOST_TEST(at(2000ms) == 15.0, boost::test_tools::tolerance(0.02));  // half way back
    BOOST_TEST(at(2000ms) == 20.0, boost::test_tools::tolerance(0.02));  // the estimate
    // 1 s past: 20 + 0.5 + 0.2; 10 s past: 20 + 5 + 20.
    BOOST_TEST(at(1000ms) == 20.7, boost::test_tools::tolerance(0.02));
    BOOST_TEST(at(9000ms) == 45.0, boost::test_tools::tolerance(0.02));
}

// A 429 to a request admitted after the last decrease is a new episode, even within the hold: the decreased
// limit may still be too high (a limit Stripe lowered). One admitted before belongs to the episode already
// counted. Until the run of close episodes is `run_min` long and something was accepted in it, the dip of
// the first holds (a bucket refilled in whole tokens once a second accepts nothing between two ticks); then
// what Stripe accepted since the first of the run is its rate.
BOOST_AUTO_TEST_CASE(a_429_to_a_request_sent_after_the_decrease_decreases_again) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    auto t = t0;
    for (int i = 0; i < 50; ++i, t += 40ms) {  // 25/s
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false, t);
    }
    rc.on_response(t, true, t - 5ms);
    BOOST_TEST(rc.decreases() == 1u);
    double first = rc.limit();
    BOOST_TEST(first == 25 * c.decrease_factor, boost::test_tools::tolerance(0.05));
    rc.on_response(t + 100ms, true, t - 1ms);  // sent before the decrease: same episode
    BOOST_TEST(rc.decreases() == 1u);
    rc.on_response(t + 200ms, true, t + 100ms);  // sent after it, nothing accepted yet: the dip holds
    BOOST_TEST(rc.decreases() == 2u);
    BOOST_TEST(rc.limit() == first);
    for (int i = 1; i <= 8; ++i) rc.on_response(t + 100ms * i, false, t + 100ms * i);  // 10/s accepted
    rc.on_response(t + 900ms, true, t + 850ms);  // the run is 0.9 s long: measured, about 10/s
    BOOST_TEST(rc.decreases() == 3u);
    BOOST_TEST(rc.estimate() < 0.5 * 25);
    BOOST_TEST(rc.limit() < first);
}

// The decrease starts from what Stripe accepted, not from what was sent: 1000 sent in 100 ms of which 5 were
// accepted → the limit is decrease_factor × 50/s, not × 10 000/s.
BOOST_AUTO_TEST_CASE(decrease_starts_from_the_accepted_rate) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    for (int i = 0; i < 1000; ++i) BOOST_TEST_REQUIRE(rc.try_take(t0 + std::chrono::microseconds(100 * i)));
    for (int i = 0; i < 5; ++i) rc.on_response(t0 + 50ms, false);
    rc.on_response(t0 + 60ms, true);
    BOOST_TEST(rc.limit() == 50.0 * c.decrease_factor, boost::test_tools::tolerance(0.01));
}

// Slow start: from initial_rps, doubling every slow_start_step while demand presses on the limit, never while
// it does not; the first 429 ends it (AIMD from the accepted rate).
BOOST_AUTO_TEST_CASE(slow_start_doubles_under_pressure_until_the_first_429) {
    rate_config c;  // initial 10/s, doubling every 250 ms
    rate_control rc(c, t0);
    BOOST_TEST(rc.limit() == 10.0);
    BOOST_TEST(rc.in_slow_start());
    rc.on_response(t0 + 300ms, false);  // nobody waited yet: no growth
    BOOST_TEST(rc.limit() == 10.0);
    auto t = t0 + 300ms;
    for (int step = 0; step < 4; ++step) {
        while (rc.try_take(t)) rc.on_response(t, false);  // drain, then one refused: pressed
        t += 251ms;
        rc.on_response(t, false);
    }
    BOOST_TEST(rc.limit() == 160.0);
    rc.on_response(t, true);
    BOOST_TEST(!rc.in_slow_start());
    BOOST_TEST(rc.limit() < 160.0 * 0.7 + 0.01);
}

BOOST_AUTO_TEST_CASE(a_lowered_limit_takes_effect_at_once) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    auto t = t0;
    for (int i = 0; i < 1000; ++i, t += 1ms) {  // 1000/s, all accepted
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false);
    }
    rc.on_response(t, true);
    const double lowered = 1000 * c.decrease_factor;
    BOOST_TEST(rc.limit() == lowered, boost::test_tools::tolerance(0.02));
    int n = admitted(rc, t, 1000ms);
    BOOST_TEST(n <= lowered + 40);  // + the small burst
    BOOST_TEST(n >= lowered - 20);
}

// Three uncoordinated controllers, each with 200 requests in flight at most, against one account limit of
// 25/s (a bucket 25 deep, as fake-stripe keeps it), answers arriving after 0 or 300 ms. After a 30 s warm-up
// they share ≥ 90 % of the limit with < 3 % answered 429 (each probes on its own; sharing their state, below,
// they draw one sidecar's share).
BOOST_AUTO_TEST_CASE(three_sidecars_converge_on_a_shared_limit) {
    for (auto latency : {0ms, 300ms}) {
        server_bucket account{25, 25, 25, t0};
        std::vector<rate_control> sidecars;
        std::vector<std::deque<std::pair<tp, bool>>> answers(3);
        for (int i = 0; i < 3; ++i) sidecars.emplace_back(rate_config{}, t0);
        int ok = 0, throttled = 0;
        const auto warm = t0 + 30s, end = t0 + 330s;
        for (auto t = t0; t < end; t += 1ms) {
            for (std::size_t i = 0; i < sidecars.size(); ++i) {
                auto& rc = sidecars[i];
                auto& pending = answers[i];
                for (; !pending.empty() && pending.front().first <= t; pending.pop_front())
                    rc.on_response(t, !pending.front().second);
                while (pending.size() < 200 && rc.try_take(t)) {
                    bool accepted = account.take(t);
                    pending.emplace_back(t + latency, accepted);
                    if (t >= warm) (accepted ? ok : throttled)++;
                }
            }
        }
        double rate = ok / std::chrono::duration<double>(end - warm).count();
        double share429 = double(throttled) / double(ok + throttled);
        BOOST_TEST_MESSAGE("simulated 3 sidecars, " << latency.count() << " ms: " << rate << "/s accepted, "
                                                    << 100 * share429 << " % 429");
        BOOST_TEST_CONTEXT("latency " << latency.count() << " ms") {
            BOOST_TEST(rate >= 0.9 * 25);
            BOOST_TEST(share429 < 0.03);
            for (auto& rc : sidecars) BOOST_TEST(rc.decreases() > 0u);  // the limiter was really hit
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
