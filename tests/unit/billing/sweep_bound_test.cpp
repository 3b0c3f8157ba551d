// The sweeper's pure timing (billing/sweeper.hpp), without a database.
#include <boost/test/unit_test.hpp>

#include "billing/sweeper.hpp"

using namespace std::chrono_literals;
using namespace cg;

// The sweep bound (sweeper.hpp): 2 × msg_timeout + the longest requeue delay + the lease-held jitter.
BOOST_AUTO_TEST_CASE(sweep_bound_follows_its_formula) {
    billing::pipeline_config c;  // defaults: new_key_quiet 5 min dominates the requeue delays
    BOOST_TEST(billing::sweep_bound(c, 60s).count() == (120s + 300s + 100ms + 10s).count());
    c.new_key_quiet = 1s;
    c.postgres_backoff.max = 45s;  // now the longest requeue
    c.lease = 200s;                // its tenth beats lease_held_delay
    BOOST_TEST(billing::sweep_bound(c, 30s).count() == std::chrono::milliseconds(60s + 45s + 20s).count());
    c.max_requeue_delay = 10s;  // nsqd's --max-req-timeout caps every requeue
    BOOST_TEST(billing::sweep_bound(c, 30s).count() == std::chrono::milliseconds(60s + 10s + 20s).count());
    BOOST_TEST(billing::sweep_interval(430s).count() == std::chrono::milliseconds(60s).count());
    BOOST_TEST(billing::sweep_interval(8s).count() == std::chrono::milliseconds(2s).count());
    BOOST_TEST(billing::sweep_interval(1s).count() == std::chrono::milliseconds(1s).count());
}
