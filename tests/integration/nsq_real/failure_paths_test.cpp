// The failure-path scenarios of tests/integration/nsq/scenarios.hpp against nsqd 1.3.0 (the nsq suite runs
// them against fake-nsqd): FIN/REQ/TOUCH refused once a connection is ending, and
// RDY within max_in_flight counting the deliveries still in hand.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/write.hpp>
#include <boost/test/unit_test.hpp>

#include "harness.hpp"
#include "tests/integration/nsq/scenarios.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;

namespace {

// (conformance_test.cpp has a `broker` of its own in this unity target.)
nsqscenario::broker real_broker(real_nsqd& n, std::string name) {
    nsqscenario::broker b;
    b.name = std::move(name);
    b.tcp_address = n.tcp_address();
    b.publish = [&n](std::string topic, std::vector<std::string> bodies) -> asio::awaitable<void> {
        co_await n.http().mpub(std::move(topic), std::move(bodies));
    };
    b.channel = [&n](std::string topic, std::string channel) -> asio::awaitable<nsqscenario::channel_view> {
        auto s = co_await n.http().stats(topic, channel);
        co_return nsqscenario::channel_view{s.depth, s.in_flight_count, s.deferred_count, s.timeout_count};
    };
    b.create_channel = [&n](std::string topic, std::string channel) -> asio::awaitable<void> {
        co_await n.http().create_channel(std::move(topic), std::move(channel));
    };
    b.start = [&n]() -> asio::awaitable<void> { co_await n.start(); };
    b.drop = [&n]() -> asio::awaitable<void> { co_await n.stop(); };  // nsqd closes its clients on exit
    return b;
}

}  // namespace

BOOST_AUTO_TEST_CASE(real_nsqd_fin_req_and_touch_are_refused_once_the_connection_is_ending) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd nsqd;
            co_await nsqd.start();
            co_await nsqscenario::answers_are_refused_once_the_connection_is_ending(real_broker(nsqd, "nsqd"),
                                                                                    "ending");
        },
        seconds(30));
}

BOOST_AUTO_TEST_CASE(real_nsqd_joining_gets_rdy_only_as_the_deliveries_in_hand_elsewhere_finish) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd a;
            co_await a.start();
            nsqd_options bo;
            bo.tcp_port = free_port();
            bo.http_port = free_port();
            real_nsqd b(bo);  // started by the scenario
            co_await nsqscenario::a_joining_nsqd_waits_for_deliveries_in_hand(
                real_broker(a, "nsqd A"), real_broker(b, "nsqd B"), "join");
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(real_nsqd_dropped_running_deliveries_keep_their_budget_until_their_handlers_finish) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd a, b;
            co_await a.start();
            co_await b.start();
            co_await nsqscenario::a_dropped_nsqds_running_deliveries_keep_their_budget(
                real_broker(a, "nsqd A"), real_broker(b, "nsqd B"), "orphan");
        },
        seconds(60));
}
