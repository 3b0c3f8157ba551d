// fake-stripe's limiter (tests/doubles/stripe/limiter.hpp) changing its limits while running, in simulated
// time: the new rate holds from the change on, and the buckets keep what they hold (no fresh burst).
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

BOOST_AUTO_TEST_SUITE_END()
