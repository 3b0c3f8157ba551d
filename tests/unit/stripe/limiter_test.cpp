// fake-stripe's limiter (tests/doubles/stripe/limiter.hpp) changing its limits while running, in simulated
// time: the new rate holds from the change on, and the buckets keep what they hold (no fresh burst); and its
// bucket's variants (depth, refill continuous or in whole tokens per tick), each at its rate in the long run.
#include "tests/doubles/stripe/limiter.hpp"

#include <boost/test/unit_test.hpp>

using cg::fake::limiter;
using namespace std::chrono_literals;

namespace {

const auto lim_t0 = limiter::clock::time_point(std::chrono::seconds(100));

// Requests lim_admitted on one endpoint when asking every millisecond over [from, from + span).
int lim_admitted(limiter& l, limiter::clock::time_point from, std::chrono::milliseconds span) {
    int ok = 0;
    for (auto t = from; t < from + span; t += 1ms)
        ok += l.admit("POST /v1/charges", t, 0) == limiter::verdict::ok;
    return ok;
}

// Requests admitted at one instant (as many as ask).
int at_once(limiter& l, limiter::clock::time_point t) {
    int ok = 0;
    while (l.admit("POST /v1/charges", t, 0) == limiter::verdict::ok) ++ok;
    return ok;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(limiter_changes)

BOOST_AUTO_TEST_CASE(a_lowered_rate_holds_at_once_without_a_fresh_burst) {
    limiter l;
    l.set({0, 25, 1, 0}, lim_t0);
    int first = lim_admitted(l, lim_t0, 2000ms);  // the full bucket, then 25/s
    BOOST_TEST(first >= 74);
    BOOST_TEST(first <= 75);
    l.set({0, 15, 1, 0}, lim_t0 + 2000ms);  // the bucket was empty: it stays empty
    int ok = lim_admitted(l, lim_t0 + 2000ms, 4000ms);
    BOOST_TEST(ok >= 59);
    BOOST_TEST(ok <= 61);
    BOOST_TEST(l.changes() == 2u);
}

BOOST_AUTO_TEST_CASE(a_raised_rate_holds_at_once) {
    limiter l;
    l.set({0, 15, 1, 0}, lim_t0);
    (void)lim_admitted(l, lim_t0, 2000ms);
    l.set({0, 25, 1, 0}, lim_t0 + 2000ms);
    int ok = lim_admitted(l, lim_t0 + 2000ms, 4000ms);
    BOOST_TEST(ok >= 99);
    BOOST_TEST(ok <= 101);
}

BOOST_AUTO_TEST_CASE(a_full_bucket_is_capped_at_the_new_depth) {
    limiter l;
    l.set({0, 25, 1, 0}, lim_t0);
    (void)l.admit("POST /v1/charges", lim_t0, 0);
    // 10 s idle: full (25); lowered to 10/s, 1 s deep: 10 tokens, not 25.
    l.set({0, 10, 1, 0}, lim_t0 + 10s);
    BOOST_TEST(lim_admitted(l, lim_t0 + 10s, 50ms) == 10);
}

BOOST_AUTO_TEST_CASE(the_account_bucket_changes_too) {
    limiter l;
    l.set({100, 0, 1, 0}, lim_t0);
    (void)lim_admitted(l, lim_t0, 2000ms);
    l.set({50, 0, 1, 0}, lim_t0 + 2000ms);
    int ok = lim_admitted(l, lim_t0 + 2000ms, 2000ms);
    BOOST_TEST(ok >= 99);
    BOOST_TEST(ok <= 101);
    l.set({0, 0, 1, 0}, lim_t0 + 4000ms);  // off
    BOOST_TEST(lim_admitted(l, lim_t0 + 4000ms, 100ms) == 100);
}

// Each variant: the first burst is its depth, the long run its rate; a stepped refill grants nothing between
// two ticks and rate × tick at each.
BOOST_AUTO_TEST_CASE(bucket_variants_burst_their_depth_and_hold_their_rate) {
    struct row {
        double burst_s, refill_s;
        int burst;  // admitted at once from a full bucket of 25/s
    };
    for (auto r :
         {row{1, 0, 25}, row{0.2, 0, 5}, row{2, 0, 50}, row{1, 1, 25}, row{0.2, 0.1, 5}, row{2, 1, 50}}) {
        BOOST_TEST_CONTEXT("burst " << r.burst_s << " s, refill " << r.refill_s << " s") {
            limiter l;
            cg::fake::limits lim;
            lim.endpoint_rps = 25;
            lim.burst_s = r.burst_s;
            lim.refill_s = r.refill_s;
            l.set(lim, lim_t0);
            BOOST_TEST(at_once(l, lim_t0) == r.burst);
            // 10 s more at 25/s, asking once a millisecond (its last tick's tokens included).
            int ok = lim_admitted(l, lim_t0, 10030ms);
            BOOST_TEST(ok >= 249);
            BOOST_TEST(ok <= 251);
        }
    }
}

BOOST_AUTO_TEST_CASE(a_stepped_refill_grants_whole_tokens_at_each_tick) {
    limiter l;
    cg::fake::limits lim;
    lim.endpoint_rps = 20;
    lim.burst_s = 1;
    lim.refill_s = 1;
    l.set(lim, lim_t0);                                     // lim_t0 is on a tick of the clock
    BOOST_TEST(at_once(l, lim_t0) == 20);                   // the full bucket
    BOOST_TEST(lim_admitted(l, lim_t0 + 1ms, 998ms) == 0);  // nothing until the next tick
    BOOST_TEST(at_once(l, lim_t0 + 1000ms) == 20);          // 20 at once at the tick
    BOOST_TEST(lim_admitted(l, lim_t0 + 1001ms, 999ms) == 0);
    lim.refill_s = 0.1;  // 2 every 100 ms
    l.set(lim, lim_t0 + 2000ms);
    BOOST_TEST(at_once(l, lim_t0 + 2000ms) == 20);
    BOOST_TEST(lim_admitted(l, lim_t0 + 2001ms, 99ms) == 0);
    BOOST_TEST(at_once(l, lim_t0 + 2100ms) == 2);
    BOOST_TEST(lim_admitted(l, lim_t0 + 2101ms, 99ms) == 0);
    lim.refill_s = 0;  // continuous: one every 50 ms
    l.set(lim, lim_t0 + 2200ms);
    BOOST_TEST(at_once(l, lim_t0 + 2200ms) == 2);
    BOOST_TEST(lim_admitted(l, lim_t0 + 2201ms, 110ms) == 2);
}

BOOST_AUTO_TEST_SUITE_END()
