// The one exponential backoff (net/backoff.hpp): table tests of the doubling, the cap, the attempt
// numbering and both jitter conventions, without a clock or a random source.
#include "net/backoff.hpp"

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <limits>
#include <vector>

using namespace cg;
using namespace std::chrono_literals;
using std::chrono::milliseconds;

BOOST_AUTO_TEST_SUITE(net_backoff)

BOOST_AUTO_TEST_CASE(exponential_doubles_up_to_the_cap) {
    struct row {
        milliseconds base;
        std::uint64_t doublings;
        milliseconds cap;
        milliseconds want;
    };
    const std::vector<row> rows{
        {100ms, 0, 1000ms, 100ms},
        {100ms, 1, 1000ms, 200ms},
        {100ms, 3, 1000ms, 800ms},
        {100ms, 4, 1000ms, 1000ms},  // 1600 capped
        {100ms, 65535, 1000ms, 1000ms},
        {100ms, std::numeric_limits<std::uint64_t>::max(), 1000ms, 1000ms},  // bounded work, no overflow
        {500ms, 1, 1001ms, 1000ms},   // exactly 2·base under an odd cap
        {2000ms, 0, 1000ms, 1000ms},  // base above the cap: the cap
        {0ms, 5, 1000ms, 0ms},
        {0ms, 5, 0ms, 0ms},
        {1ms, 62, milliseconds(std::numeric_limits<std::int64_t>::max()),
         milliseconds(std::int64_t{1} << 62)},
        {3ms, 70, milliseconds(std::numeric_limits<std::int64_t>::max()),
         milliseconds(std::numeric_limits<std::int64_t>::max())},  // saturates at the largest count
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("base " << r.base.count() << " doublings " << r.doublings << " cap "
                                   << r.cap.count()) {
            BOOST_TEST(net::exponential_delay(r.base, r.doublings, r.cap).count() == r.want.count());
        }
    }
}

BOOST_AUTO_TEST_CASE(jitter_conventions) {
    struct row {
        net::jitter j;
        milliseconds d;
        double unit;
        milliseconds want;
    };
    const std::vector<row> rows{
        {net::jitter::none, 1000ms, 0.0, 1000ms},        {net::jitter::none, 1000ms, 0.99, 1000ms},
        {net::jitter::spread_20, 1000ms, 0.0, 800ms},    {net::jitter::spread_20, 1000ms, 0.5, 1000ms},
        {net::jitter::spread_20, 1000ms, 0.999, 1199ms},  // below 1.2 · d
        {net::jitter::spread_20, 1000ms, 7.0, 1200ms},    // unit clamped to [0, 1]
        {net::jitter::half_up, 1000ms, 0.0, 500ms},      {net::jitter::half_up, 1000ms, 0.5, 750ms},
        {net::jitter::half_up, 1000ms, 1.0, 1000ms},     {net::jitter::half_up, 1000ms, -3.0, 500ms},
        {net::jitter::half_up, 3ms, 0.0, 1ms},  // truncated to whole milliseconds
        {net::jitter::spread_20, 0ms, 0.7, 0ms},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("jitter " << static_cast<int>(r.j) << " d " << r.d.count() << " unit " << r.unit) {
            BOOST_TEST(net::apply_jitter(r.d, r.j, r.unit).count() == r.want.count());
        }
    }
}

BOOST_AUTO_TEST_CASE(backoff_delay_counts_attempts_from_one) {
    struct row {
        net::backoff b;
        std::uint64_t attempt;
        double unit;
        milliseconds want;
    };
    const net::backoff plain{100ms, 1000ms, net::jitter::none};
    const net::backoff spread{100ms, 1000ms, net::jitter::spread_20};
    const net::backoff half{500ms, 5000ms, net::jitter::half_up};
    const std::vector<row> rows{
        {plain, 0, 0.0, 100ms},  // 0 counts as the first
        {plain, 1, 0.0, 100ms},  {plain, 2, 0.0, 200ms},      {plain, 4, 0.0, 800ms},
        {plain, 5, 0.0, 1000ms}, {plain, 40, 0.0, 1000ms},    {spread, 1, 0.0, 80ms},
        {spread, 2, 0.5, 200ms}, {spread, 40, 0.999, 1199ms}, {half, 1, 0.0, 250ms},
        {half, 3, 1.0, 2000ms},  {half, 10, 0.0, 2500ms},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("initial " << r.b.initial.count() << " attempt " << r.attempt << " unit "
                                      << r.unit) {
            BOOST_TEST(net::backoff_delay(r.b, r.attempt, r.unit).count() == r.want.count());
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
