#include "stripe/retry.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::stripe;
using ms = std::chrono::milliseconds;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(retry)

BOOST_AUTO_TEST_CASE(sdk_default_backoff_table) {
    retry_policy p;  // 2 retries, 500 ms, 5 s
    struct row {
        unsigned retry;
        double unit;
        long want_ms;
    };
    const row rows[] = {
        {1, 0.0, 500},                    // min(500,5000)=500 · 0.5 = 250 → floored at the initial 500
        {1, 0.999, 500},                  // 500 · 0.9995 = 499.75 → floored at 500
        {2, 0.0, 500},                    // 1000 · 0.5
        {2, 1.0, 1000},  {3, 0.5, 1500},  // 2000 · 0.75
        {4, 1.0, 4000},  {5, 1.0, 5000},  // capped
        {9, 0.0, 2500},                   // 5000 · 0.5
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("retry " << r.retry << " unit " << r.unit) {
            auto d = backoff_delay(p, r.retry, r.unit);
            BOOST_TEST(d.count() == r.want_ms);
        }
    }
}

BOOST_AUTO_TEST_CASE(delay_stays_in_bounds) {
    retry_policy p{5, 20ms, 100ms};
    for (unsigned n = 1; n <= 8; ++n)
        for (double u : {0.0, 0.25, 0.5, 0.75, 0.999}) {
            auto d = backoff_delay(p, n, u);
            BOOST_TEST(d >= 20ms);
            BOOST_TEST(d <= 100ms);
        }
}

BOOST_AUTO_TEST_CASE(retry_after_is_honoured_up_to_the_cap) {
    retry_policy p;
    BOOST_TEST(backoff_delay(p, 1, 0.0, std::chrono::seconds(2)) == ms(2000));
    BOOST_TEST(backoff_delay(p, 1, 0.0, std::chrono::seconds(60)) == ms(5000));
    BOOST_TEST(backoff_delay(p, 2, 1.0, std::chrono::seconds(0)) == ms(1000));
}

BOOST_AUTO_TEST_SUITE_END()
