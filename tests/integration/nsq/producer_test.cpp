// The producer against fake-nsqd: PUB/MPUB/DPUB answered in order, nsqd's errors surfaced, reconnect.
#include "nsq/producer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "nsq/proto/error.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;

BOOST_AUTO_TEST_CASE(pub_mpub_dpub_and_reconnect) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.create_channel("p", "c");
        cg::nsq::producer_config pc;
        pc.heartbeat_interval = milliseconds(1000);
        pc.reconnect_backoff_min = milliseconds(20);
        cg::nsq::producer prod(ex, nsqd.tcp_address(), pc, {});
        BOOST_REQUIRE((co_await prod.publish("p", "one")).has_value());
        std::vector<std::string> bodies{"a", "bb", "ccc"};
        BOOST_REQUIRE((co_await prod.multi_publish("p", bodies)).has_value());
        BOOST_REQUIRE((co_await prod.deferred_publish("p", milliseconds(1500), "later")).has_value());
        BOOST_TEST(nsqd.topic_message_count("p") == 5u);
        BOOST_TEST(nsqd.channel("p", "c").depth == 4);
        BOOST_TEST(nsqd.channel("p", "c").deferred == 1);
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("p", "c").depth == 5; }));
        // Stays connected across heartbeats (answers them).
        co_await cg::net::sleep_for(milliseconds(2300));
        BOOST_TEST(nsqd.heartbeat_disconnects() == 0u);
        BOOST_TEST(nsqd.total_connections() == 1u);
        // An invalid name never leaves the process.
        auto bad = co_await prod.publish("bad!topic", "x");
        BOOST_TEST((bad.code() == cg::nsq::errc::bad_name));
        // The connection is dropped; the next publish reconnects.
        nsqd.drop_all_connections();
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.client_count() == 0; }));
        auto r = co_await prod.publish("p", "after-drop");
        if (!r) r = co_await prod.publish("p", "after-drop");  // the first may see the dead connection
        BOOST_REQUIRE(r.has_value());
        BOOST_TEST(nsqd.total_connections() == 2u);
        BOOST_TEST(prod.published_messages() >= 6u);
        co_await prod.close();
    });
}

BOOST_AUTO_TEST_CASE(concurrent_publishes_are_pipelined_and_all_answered) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        cg::nsq::producer prod(ex, nsqd.tcp_address(), {}, {});
        int ok = 0;
        for (int i = 0; i < 50; ++i)
            asio::co_spawn(
                ex,
                [&prod, &ok, i]() -> asio::awaitable<void> {
                    if (co_await prod.publish("pp", std::to_string(i))) ++ok;
                },
                asio::detached);
        BOOST_REQUIRE(co_await eventually([&] { return ok == 50; }));
        BOOST_TEST(nsqd.topic_message_count("pp") == 50u);
        BOOST_TEST(nsqd.total_connections() == 1u);
        co_await prod.close();
    });
}
