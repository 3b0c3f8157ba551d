// stripe::rate_control: the hard ceiling, the AIMD limit, and three uncoordinated controllers sharing one
// account's limit (simulated time, no I/O).
#include "stripe/rate_control.hpp"

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <deque>
#include <vector>

using namespace cg::stripe;
using namespace std::chrono_literals;
using tp = rate_control::time_point;

namespace {

const tp t0{std::chrono::seconds(1000)};

// Admissions in [from, from + span) when asking every `step` (a caller with unbounded demand).
int admitted(rate_control& rc, tp from, std::chrono::milliseconds span,
             std::chrono::microseconds step = 100us) {
    int n = 0;
    for (auto t = from; t < from + span; t += step)
        while (rc.try_take(t)) ++n;
    return n;
}

// A server-side token bucket like fake-stripe's: `rate` per second, `burst` deep.
struct server_bucket {
    double rate, burst, tokens;
    tp last;
    bool take(tp now) {
        tokens = std::min(burst, tokens + std::chrono::duration<double>(now - last).count() * rate);
        last = now;
        if (tokens < 1) return false;
        tokens -= 1;
        return true;
    }
};

}  // namespace

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

// AIMD: a 429 takes the limit to decrease_factor × the rate Stripe accepted; more 429s within the hold are
// one episode; after the hold another 429 decreases again; answers without a 429 add increase_rps_per_s per
// second; the ceiling and the floor hold.
BOOST_AUTO_TEST_CASE(aimd_table) {
    rate_config c;
    c.initial_rps = 0;
    c.increase_rps_per_s = 0.5;
    c.decrease_factor = 0.8;
    c.decrease_hold = 1000ms;
    c.min_rps = 2;
    rate_control rc(c, t0);
    // Send 50/s for 2 s.
    auto t = t0;
    for (int i = 0; i < 100; ++i, t += 20ms) {
        BOOST_TEST_REQUIRE(rc.try_take(t));
        rc.on_response(t, false);
    }
    rc.on_response(t, true);
    BOOST_TEST(rc.limit() == 40.0, boost::test_tools::tolerance(1.0));
    rc.on_response(t + 500ms, true);  // same episode
    BOOST_TEST(rc.limit() == 40.0, boost::test_tools::tolerance(1.0));
    BOOST_TEST(rc.decreases() == 1u);
    rc.on_response(t + 1001ms, true);  // a new one: from min(limit, sent)
    BOOST_TEST(rc.limit() == 32.0, boost::test_tools::tolerance(1.0));
    double before = rc.limit();
    rc.on_response(t + 3001ms, false);  // demand below the limit: no growth
    BOOST_TEST(rc.limit() == before);
    (void)admitted(rc, t + 3001ms, 10ms);  // now demand presses on the limit
    rc.on_response(t + 7001ms, false);     // 4 s without a 429
    BOOST_TEST(rc.limit() == before + 2.0, boost::test_tools::tolerance(0.01));
    // The floor.
    for (int i = 2; i < 40; ++i) rc.on_response(t + std::chrono::seconds(10 * i), true);
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
    (void)admitted(rc2, t0 + 2s, 100ms);  // press
    rc2.on_response(t0 + 600s, false);    // probing never passes the ceiling
    BOOST_TEST(rc2.limit() == 20.0);
}

// The decrease starts from what Stripe accepted, not from what was sent: 1000 sent in 100 ms of which 5 were
// accepted → the limit is 0.7 × 50/s, not 0.7 × 10 000/s.
BOOST_AUTO_TEST_CASE(decrease_starts_from_the_accepted_rate) {
    rate_config c;
    c.initial_rps = 0;
    rate_control rc(c, t0);
    for (int i = 0; i < 1000; ++i) BOOST_TEST_REQUIRE(rc.try_take(t0 + std::chrono::microseconds(100 * i)));
    for (int i = 0; i < 5; ++i) rc.on_response(t0 + 50ms, false);
    rc.on_response(t0 + 60ms, true);
    BOOST_TEST(rc.limit() == 35.0, boost::test_tools::tolerance(0.01));
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
    BOOST_TEST(rc.limit() == 700.0, boost::test_tools::tolerance(10.0));  // decrease_factor 0.7
    int n = admitted(rc, t, 1000ms);
    BOOST_TEST(n <= 740);  // ~700 + the small burst
    BOOST_TEST(n >= 680);
}

// Three uncoordinated controllers, each with 200 requests in flight at most, against one account limit of
// 25/s (a bucket 25 deep, as fake-stripe keeps it), answers arriving after 0 or 300 ms. After a 30 s warm-up
// they share ≥ 90 % of the limit with < 2 % answered 429.
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
            BOOST_TEST(share429 < 0.02);
            for (auto& rc : sidecars) BOOST_TEST(rc.decreases() > 0u);  // the limiter was really hit
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
