#include "http/pool_growth.hpp"

#include <boost/test/unit_test.hpp>
#include <vector>

using namespace std::chrono_literals;
using cg::http::pool_growth;
using cg::http::pool_growth_config;
using clock_type = pool_growth::clock;

namespace {

pool_growth_config cfg(std::size_t eager) {
    pool_growth_config c;
    c.eager = eager;
    c.headroom = 4.0;
    c.ratio = 2.0;
    c.slack = 1ms;
    c.window = 10s;
    return c;
}

// Feeds `n` answers of `took`, `gap` apart, from `from`; returns the time of the last.
clock_type::time_point feed(pool_growth& g, int n, clock_type::duration took, clock_type::duration gap,
                            clock_type::time_point from) {
    auto now = from;
    for (int i = 0; i < n; ++i) {
        now += gap;
        g.exchanged(took, now);
    }
    return now;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pool_growth_rule)

BOOST_AUTO_TEST_CASE(below_eager_always_opens_past_it_never_blind) {
    pool_growth g(cfg(4));
    clock_type::time_point t0{};
    BOOST_TEST(g.may_open(0, t0));
    BOOST_TEST(g.may_open(3, t0));
    BOOST_TEST(g.try_open(3, t0));
    // Nothing known of the origin yet: no growth past the eager size.
    BOOST_TEST(!g.may_open(4, t0));
    BOOST_TEST(!g.try_open(100, t0));
    // An eager size of 0 still lets a pool open its first connection (and no more, blind).
    pool_growth zero(cfg(0));
    BOOST_TEST(zero.try_open(0, t0));
    BOOST_TEST(!zero.may_open(1, t0));
}

// Little's law: the pool grows past its eager size only while it is smaller than 4 × rate × fastest answer.
BOOST_AUTO_TEST_CASE(past_eager_only_where_the_rate_needs_it) {
    clock_type::time_point t0{};
    {
        // Stripe at 300 ms carried by 64 connections: 213 answers/s. Little: 4 × 213 × 0.3 ≈ 256.
        pool_growth g(cfg(64));
        auto now = feed(g, 64, 300ms, 300ms / 64, t0);
        BOOST_TEST(g.rate(now) == 213.3, boost::test_tools::tolerance(0.02));
        BOOST_TEST(g.wanted(now) == 256.0, boost::test_tools::tolerance(0.02));
        BOOST_TEST(g.may_open(64, now));
        BOOST_TEST(g.may_open(240, now));
        BOOST_TEST(!g.may_open(260, now));
    }
    {
        // A fast origin at a high rate: 5 000 answers/s of 0.5 ms need 3 connections, with room for 10.
        pool_growth g(cfg(64));
        auto now = feed(g, 1000, 500us, 200us, t0);
        BOOST_TEST(g.rate(now) == 5000.0, boost::test_tools::tolerance(0.02));
        BOOST_TEST(g.wanted(now) == 10.0, boost::test_tools::tolerance(0.02));
        BOOST_TEST(!g.may_open(64, now));
    }
    {
        // Slow answers at a trickle: 10/s of 300 ms need 3 connections, with room for 12.
        pool_growth g(cfg(4));
        auto now = feed(g, 10, 300ms, 100ms, t0);
        BOOST_TEST(g.may_open(4, now));
        BOOST_TEST(g.may_open(11, now));
        BOOST_TEST(!g.may_open(12, now));
    }
}

// Each row: exchange times in order (ms, 1 ms apart — a high rate for them), and whether a pool just past
// its eager size may then grow.
BOOST_AUTO_TEST_CASE(past_eager_only_while_the_origin_keeps_its_pace) {
    struct row {
        std::vector<int> times;
        bool grows;
        const char* why;
    };
    std::vector<row> rows{
        {{300, 301, 299, 305, 302}, true, "slow but steady: every answer near the fastest"},
        {{300, 450, 500, 520, 560, 590}, true, "within 2x the fastest (601 ms)"},
        {{300, 300, 300, 300, 300, 700}, false, "the last answer took over 2x the fastest"},
        {{20, 40, 60, 80, 100}, false, "answers slow as requests pile up: a queue at the origin"},
        {{20, 40, 60, 80, 100, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20},
         true,
         "the queue drained: the average came back"},
    };
    for (const auto& r : rows) {
        pool_growth g(cfg(4));
        auto now = clock_type::time_point{} + 1s;
        for (int ms : r.times) {
            now += 1ms;
            g.exchanged(std::chrono::milliseconds(ms), now);
        }
        BOOST_TEST(g.may_open(4, now) == r.grows, r.why);
        BOOST_TEST(g.may_open(3, now), "below the eager size: always");
    }
}

// Past the eager size each paced answer lets three connections open, at most 16 banked; slow answers grant
// none, and a slowed origin stops growth even with credit left.
BOOST_AUTO_TEST_CASE(growth_past_eager_is_paced_by_answers) {
    pool_growth g(cfg(4));
    clock_type::time_point t0{};
    auto now = feed(g, 100, 300ms, 1ms, t0);  // 100 answers in 100 ms: Little wants ~200 connections
    int opened = 0;
    while (g.try_open(10, now)) ++opened;
    BOOST_TEST(opened == 16);  // the bank's cap
    g.exchanged(300ms, now += 1ms);
    BOOST_TEST(g.try_open(10, now));
    BOOST_TEST(g.try_open(11, now));
    BOOST_TEST(g.try_open(12, now));
    BOOST_TEST(!g.try_open(13, now));  // three per answer
    BOOST_TEST(g.try_open(3, now));    // below eager: no credit needed
    g.exchanged(300ms, now += 1ms);
    g.exchanged(900ms, now += 1ms);  // slow: no credit, and the last answer blocks the three banked
    BOOST_TEST(!g.may_open(10, now));
    BOOST_TEST(!g.try_open(10, now));
    g.exchanged(300ms, now += 1ms);  // paced again (the average is still within 601 ms)
    BOOST_TEST(g.try_open(10, now));
}

BOOST_AUTO_TEST_CASE(the_fastest_answer_is_forgotten_after_two_windows) {
    pool_growth g(cfg(1));
    clock_type::time_point t0{};
    g.exchanged(10ms, t0);
    BOOST_TEST(g.fastest() == 10ms);
    // The origin got slower for good (100 ms): held while the 10 ms answer is recent …
    auto now = feed(g, 50, 100ms, 1ms, t0 + 5s);
    BOOST_TEST(!g.may_open(5, now));
    g.exchanged(100ms, t0 + 11s);  // new window; the previous one still has 10 ms
    BOOST_TEST(g.fastest() == 10ms);
    BOOST_TEST(!g.may_open(5, t0 + 11s));
    // … and once it has left both windows the new pace is the fastest.
    now = feed(g, 50, 100ms, 1ms, t0 + 22s);
    BOOST_TEST(g.fastest() == 100ms);
    BOOST_TEST(g.may_open(5, now));
}

BOOST_AUTO_TEST_CASE(no_answer_for_two_windows_means_nothing_known) {
    pool_growth g(cfg(2));
    clock_type::time_point t0{};
    auto now = feed(g, 20, 50ms, 1ms, t0);
    BOOST_TEST(g.may_open(2, now));
    BOOST_TEST(!g.may_open(2, t0 + 21s));
    // A fresh answer starts over from it.
    g.exchanged(400ms, t0 + 30s);
    BOOST_TEST(g.fastest() == 400ms);
    BOOST_TEST(g.recent() == 400ms);
    BOOST_TEST(g.rate(t0 + 30s) == 2.5, boost::test_tools::tolerance(0.01));  // one answer per 400 ms bucket
}

BOOST_AUTO_TEST_CASE(default_config_never_limits) {
    pool_growth g;
    clock_type::time_point t0{};
    BOOST_TEST(g.may_open(100000, t0));
    for (int i = 1; i < 50; ++i) g.exchanged(std::chrono::milliseconds(i * 10), t0 + i * 1ms);
    BOOST_TEST(g.try_open(100000, t0 + 1s));
}

BOOST_AUTO_TEST_SUITE_END()
