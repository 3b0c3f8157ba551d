// stripe::rate_control: one controller given its peers' state (apply_peers, peer_share) — the share of the
// account's limit, leading or following, a lower leader limit taken within the hold (no I/O).
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

// The share: peers with a backlog weigh 1, one using less weighs what it uses of an even split (at least
// the idle weight); one peer alone has it all; without a finite limit the split is even.
BOOST_AUTO_TEST_CASE(peer_share_gives_what_idle_peers_leave_to_the_pressed) {
    peer_load three[] = {{true, 8}, {true, 8}, {true, 8}};
    BOOST_TEST(peer_share(three, 3, 0, 24) == 1.0 / 3, boost::test_tools::tolerance(1e-9));
    peer_load one_light[] = {{true, 10}, {true, 10}, {false, 4}};  // uses half of 24 / 3
    BOOST_TEST(peer_share(one_light, 3, 0, 24) == 1 / 2.5, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(peer_share(one_light, 3, 2, 24) == 0.5 / 2.5, boost::test_tools::tolerance(1e-9));
    peer_load idle[] = {{true, 20}, {false, 0}};
    BOOST_TEST(peer_share(idle, 2, 0, 20) == 1 / 1.02, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(peer_share(idle, 2, 0, rate_control::unlimited) == 0.5);
    BOOST_TEST(peer_share(idle, 1, 0, 20) == 1.0);
}

// An exchange: the first pressed peer leads and hears the others' 429 episodes; the others follow its
// limit and admit their share of it; a follower's own 429 decreases it at once, and the leader's figure is
// ignored for decrease_hold after it.
BOOST_AUTO_TEST_CASE(apply_peers_leads_or_follows) {
    rate_config c;
    c.initial_rps = 30;
    rate_control lead_rc(c, t0), follow_rc(c, t0);
    peer_view peers[] = {{{true, 10}, 30, false}, {{true, 10}, 30, false}};
    apply_peers(lead_rc, peers, 2, 0, t0);
    apply_peers(follow_rc, peers, 2, 1, t0);
    BOOST_TEST(!lead_rc.following());
    BOOST_TEST(follow_rc.following());
    BOOST_TEST(lead_rc.limit() == 15.0, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(follow_rc.limit() == 15.0, boost::test_tools::tolerance(1e-6));
    // The follower's 429 reaches the leader through the exchange: the leader decreases.
    for (int i = 0; i < 15; ++i) {
        auto t = t0 + std::chrono::milliseconds(1000 + 66 * i);
        lead_rc.on_response(t, false, t);
    }
    auto t1 = t0 + 2s;
    follow_rc.on_response(t1, true, t1);
    BOOST_TEST(follow_rc.throttled_episodes() == 1u);
    BOOST_TEST(follow_rc.decreases() == 1u);
    peers[1].throttled_since = true;
    std::uint64_t before = lead_rc.decreases();
    apply_peers(lead_rc, peers, 2, 0, t1 + 100ms);
    BOOST_TEST(lead_rc.decreases() == before + 1);
    BOOST_TEST(lead_rc.throttled_episodes() == 0u);  // not its own: not repeated back
    // Within decrease_hold of its own 429 the follower keeps its decrease; after it, the leader's limit.
    double own = follow_rc.limit();
    peers[0].account_limit = 40;
    apply_peers(follow_rc, peers, 2, 1, t1 + 500ms);
    BOOST_TEST(follow_rc.limit() == own);
    apply_peers(follow_rc, peers, 2, 1, t1 + 1500ms);
    BOOST_TEST(follow_rc.limit() == 20.0, boost::test_tools::tolerance(1e-6));
    // The leader idle, the follower pressed: the follower leads.
    peers[0].load.pressed = false;
    peers[0].load.sent_rps = 0;
    apply_peers(follow_rc, peers, 2, 1, t1 + 1600ms);
    BOOST_TEST(!follow_rc.following());
}

// A follower within decrease_hold of its own 429 keeps its decrease against the leader's figure, which may
// not count that 429 yet, but takes a lower one at once (the leader's own decrease, deeper).
BOOST_AUTO_TEST_CASE(a_follower_takes_a_lower_leader_limit_within_its_hold) {
    rate_config c;
    c.initial_rps = 30;
    rate_control rc(c, t0);
    peer_view peers[] = {{{true, 10}, 30, false}, {{true, 10}, 30, false}};
    apply_peers(rc, peers, 2, 1, t0);
    BOOST_TEST_REQUIRE(rc.following());
    for (int i = 0; i < 30; ++i) {  // 15/s of its own accepted for 2 s: 30/s of the account's
        auto t = t0 + std::chrono::milliseconds(66 * i);
        rc.on_response(t, false, t);
    }
    auto t1 = t0 + 2s;
    rc.on_response(t1, true, t1);
    double own = rc.account_limit();
    BOOST_TEST_REQUIRE(own > 4.0);
    BOOST_TEST_REQUIRE(own < 30.0);
    peers[0].account_limit = own * 2;  // the leader has not heard of it yet: ignored
    apply_peers(rc, peers, 2, 1, t1 + 200ms);
    BOOST_TEST(rc.account_limit() == own);
    peers[0].account_limit = own / 2;  // lower: taken within the hold
    apply_peers(rc, peers, 2, 1, t1 + 400ms);
    BOOST_TEST(rc.account_limit() == own / 2, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(rc.limit() == own / 4, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_SUITE_END()
