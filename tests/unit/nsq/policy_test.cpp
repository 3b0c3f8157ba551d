// Pure consumer policies, table-driven: RDY distribution, go-nsq backoff, keepalive timing, reconnect.
#include "nsq/policy.hpp"

#include <boost/test/unit_test.hpp>
#include <numeric>

#include "nsq/config.hpp"

using namespace cg::nsq;
using namespace std::chrono;

namespace {
unsigned sum(const std::vector<unsigned>& v) {
    return std::accumulate(v.begin(), v.end(), 0u);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(rdy)

BOOST_AUTO_TEST_CASE(spreads_within_max_in_flight_and_max_rdy) {
    struct row {
        unsigned conns, mif, max_rdy;
        std::vector<unsigned> want;
    };
    const row rows[] = {
        {1, 2500, 2500, {2500}},  {1, 5000, 2500, {2500}},  // capped per connection by max_rdy_count
        {3, 10, 2500, {4, 3, 3}},                           // remainder to the first
        {3, 3, 2500, {1, 1, 1}},  {2, 2500, 1000, {1000, 1000}},
    };
    for (const auto& r : rows) {
        std::vector<rdy_conn> in(r.conns, rdy_conn{0, r.max_rdy, {}});
        std::size_t cursor = 0;
        auto out = plan_rdy(in, r.mif, seconds(10), cursor);
        BOOST_TEST(out == r.want, "conns=" << r.conns << " mif=" << r.mif);
        BOOST_TEST(sum(out) <= r.mif);
    }
}

BOOST_AUTO_TEST_CASE(rotates_rdy_1_when_connections_outnumber_max_in_flight) {
    std::vector<rdy_conn> in(5, rdy_conn{0, 2500, {}});
    std::size_t cursor = 0;
    auto first = plan_rdy(in, 2, seconds(10), cursor);
    BOOST_TEST(sum(first) == 2u);
    BOOST_TEST((first == std::vector<unsigned>{1, 1, 0, 0, 0}));
    // Holders busy: they keep RDY.
    for (std::size_t i = 0; i < 5; ++i) in[i].current = first[i];
    auto busy = plan_rdy(in, 2, seconds(10), cursor);
    BOOST_TEST(busy == first);
    // Holders idle past the timeout: RDY moves on to the next ones.
    in[0].idle = in[1].idle = seconds(11);
    auto moved = plan_rdy(in, 2, seconds(10), cursor);
    BOOST_TEST((moved == std::vector<unsigned>{0, 0, 1, 1, 0}));
    for (std::size_t i = 0; i < 5; ++i) in[i] = {moved[i], 2500, seconds(11)};
    auto again = plan_rdy(in, 2, seconds(10), cursor);
    BOOST_TEST(sum(again) == 2u);
    BOOST_TEST(again[4] == 1u);  // the one that never had it gets it now
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(backoff)

BOOST_AUTO_TEST_CASE(go_nsq_semantics) {
    backoff_policy b(milliseconds(1000), milliseconds(120000));
    BOOST_TEST((b.on_success().act == backoff_policy::action::none));
    auto d = b.on_failure();
    BOOST_TEST((d.act == backoff_policy::action::backoff));
    BOOST_TEST(d.duration.count() == 2000);  // multiplier · 2^1
    BOOST_TEST(b.level() == 1);
    // During the timeout, signals are ignored.
    BOOST_TEST((b.on_failure().act == backoff_policy::action::none));
    BOOST_TEST(b.level() == 1);
    b.timeout_expired();
    d = b.on_failure();
    BOOST_TEST(d.duration.count() == 4000);
    BOOST_TEST(b.level() == 2);
    b.timeout_expired();
    d = b.on_success();  // one step down, still backing off
    BOOST_TEST((d.act == backoff_policy::action::backoff));
    BOOST_TEST(d.duration.count() == 2000);
    b.timeout_expired();
    d = b.on_continue();  // requeue without backoff: same level, the backoff continues
    BOOST_TEST((d.act == backoff_policy::action::backoff));
    BOOST_TEST(b.level() == 1);
    b.timeout_expired();
    d = b.on_success();
    BOOST_TEST((d.act == backoff_policy::action::resume_all));
    BOOST_TEST(b.level() == 0);
    BOOST_TEST(!b.backing_off());
}

BOOST_AUTO_TEST_CASE(level_stops_at_max_duration) {
    backoff_policy b(milliseconds(1000), milliseconds(8000));
    for (int i = 0; i < 10; ++i) {
        auto d = b.on_failure();
        BOOST_TEST(d.duration.count() <= 8000);
        b.timeout_expired();
    }
    BOOST_TEST(b.level() == 3);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(keepalive_touches_at_half_timeout_and_stops_before_the_cap) {
    auto t0 = steady_clock::time_point{} + hours(1);
    auto n = next_touch(t0, t0, seconds(60), minutes(15));
    BOOST_REQUIRE(n.has_value());
    BOOST_TEST((*n - t0 == seconds(30)));
    // Late in the message's life: a TOUCH could not extend past delivery + 15 min.
    BOOST_TEST(next_touch(t0 + minutes(14) + seconds(20), t0, seconds(60), minutes(15)).has_value() == false);
    BOOST_TEST(next_touch(t0 + minutes(13), t0, seconds(60), minutes(15)).has_value());
}

BOOST_AUTO_TEST_CASE(reconnect_delay_grows_and_caps) {
    BOOST_TEST(reconnect_delay(1, milliseconds(100), milliseconds(1000), 0.5).count() == 100);
    BOOST_TEST(reconnect_delay(2, milliseconds(100), milliseconds(1000), 0.5).count() == 200);
    BOOST_TEST(reconnect_delay(4, milliseconds(100), milliseconds(1000), 0.5).count() == 800);
    BOOST_TEST(reconnect_delay(40, milliseconds(100), milliseconds(1000), 0.5).count() == 1000);
    BOOST_TEST(reconnect_delay(1, milliseconds(100), milliseconds(1000), 0.0).count() == 80);
    BOOST_TEST(default_requeue_delay(3, seconds(90), minutes(15)).count() == 270000);
    BOOST_TEST(default_requeue_delay(100, seconds(90), minutes(15)).count() == 900000);
}

BOOST_AUTO_TEST_CASE(config_validation_refuses_what_nsqd_would) {
    consumer_config c;
    c.topic = "t";
    c.channel = "c";
    c.nsqd_tcp_addresses = {"127.0.0.1:4150"};
    BOOST_TEST(validate(c).has_value());
    auto bad = c;
    bad.msg_timeout = milliseconds(500);
    auto r = validate(bad);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(r.err().message.find("msg_timeout 500 ms is out of range") != std::string::npos);
    bad.msg_timeout = milliseconds(900001);
    BOOST_TEST(!validate(bad).has_value());
    bad = c;
    bad.heartbeat_interval = milliseconds(999);
    BOOST_TEST(!validate(bad).has_value());
    bad = c;
    bad.topic = "bad!";
    BOOST_TEST(!validate(bad).has_value());
    bad = c;
    bad.nsqd_tcp_addresses = {};
    BOOST_TEST(!validate(bad).has_value());
    bad.lookupd_http_addresses = {"http://127.0.0.1:4161"};
    BOOST_TEST(validate(bad).has_value());
    bad.nsqd_tcp_addresses = {"nope"};
    BOOST_TEST(!validate(bad).has_value());
    bad = c;
    bad.max_in_flight = 0;
    BOOST_TEST(!validate(bad).has_value());
}

BOOST_AUTO_TEST_CASE(backoff_is_rearmed_only_when_nothing_else_moves_it) {
    struct row {
        bool backing_off, in_timeout, trial_out, handlers;
        bool rearm;
    };
    const row rows[] = {
        {false, false, false, false, false},  // not backing off
        {true, true, false, false, false},    // the timer is armed
        {true, false, true, false, false},    // a trial RDY 1 is out
        {true, false, false, true, false},    // a handler's result will decide
        {true, false, false, false, true},    // the trial's connection dropped: nothing would ever move
        {true, true, true, true, false},
    };
    for (const auto& r : rows) {
        backoff_progress p{r.backing_off, r.in_timeout, r.trial_out, r.handlers};
        BOOST_TEST(backoff_needs_rearm(p) == r.rearm,
                   r.backing_off << r.in_timeout << r.trial_out << r.handlers);
    }
}
