// The sweeper's pure timing (billing/heal/sweeper.hpp), without a database.
#include <boost/test/unit_test.hpp>

#include "billing/heal/sweeper.hpp"

using namespace std::chrono_literals;
using namespace cg;

// The sweep bound (sweeper.hpp): 2 × msg_timeout + the longest requeue delay + the lease-held jitter.
BOOST_AUTO_TEST_CASE(sweep_bound_follows_its_formula) {
    billing::charge_flow_config c;  // defaults: new_key_quiet 5 min dominates the requeue delays
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

// After a failover (sweeper.hpp): the interval is a thirtieth of the lease within [1 s, 5 s], the grace two
// lease renewals and an interval, the window the longer of the lease and the grace plus two intervals; set
// values are kept.
BOOST_AUTO_TEST_CASE(failover_sweeps_follow_the_lease) {
    using std::chrono::milliseconds;
    billing::charge_flow_config p;  // lease 60 s, renewed every 15 s
    billing::sweeper_config c;
    billing::derive_failover_sweeps(c, p);
    BOOST_TEST(c.failover_interval.count() == milliseconds(2s).count());
    BOOST_TEST(c.failover_grace.count() == milliseconds(32s).count());
    BOOST_TEST(c.failover_window.count() == milliseconds(64s).count());
    p.lease = 6s;  // the chaos profiles
    p.lease_renew_interval = 1500ms;
    billing::sweeper_config s;
    billing::derive_failover_sweeps(s, p);
    BOOST_TEST(s.failover_interval.count() == milliseconds(1s).count());
    BOOST_TEST(s.failover_grace.count() == milliseconds(4s).count());
    BOOST_TEST(s.failover_window.count() == milliseconds(8s).count());
    p.lease = 300s;
    p.lease_renew_interval = 200s;  // a grace longer than the lease stretches the window
    billing::sweeper_config l;
    billing::derive_failover_sweeps(l, p);
    BOOST_TEST(l.failover_interval.count() == milliseconds(5s).count());
    BOOST_TEST(l.failover_grace.count() == milliseconds(405s).count());
    BOOST_TEST(l.failover_window.count() == milliseconds(415s).count());
    billing::sweeper_config set;
    set.failover_grace = 0ms;  // no grace, as asked
    set.failover_interval = 3s;
    billing::derive_failover_sweeps(set, p);
    BOOST_TEST(set.failover_grace.count() == 0);
    BOOST_TEST(set.failover_interval.count() == milliseconds(3s).count());
}
