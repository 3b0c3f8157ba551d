// Failure paths against fake-nsqd (the shared scenarios also run against nsqd 1.3.0 in nsq_real): RDY
// within max_in_flight counting the deliveries still in hand, deliveries of a failed connection dropped
// unhandled, FIN/REQ/TOUCH refused once a connection is ending, publishes nsqd would refuse fatally failing
// alone, and AUTH answered after a heartbeat.
#include <boost/test/unit_test.hpp>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "nsq/proto/commands.hpp"
#include "scenarios.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
using nsqscenario::broker;

namespace {

// `address`: for a fake-nsqd started later on a port chosen now.
broker fake_broker(fake_nsqd& f, std::string name, std::string address = {}) {
    broker b;
    b.name = std::move(name);
    b.tcp_address = address.empty() ? f.tcp_address() : std::move(address);
    b.publish = [&f](std::string topic, std::vector<std::string> bodies) -> asio::awaitable<void> {
        for (auto& x : bodies) f.publish(topic, std::move(x));
        co_return;
    };
    b.channel = [&f](std::string topic, std::string channel) -> asio::awaitable<nsqscenario::channel_view> {
        auto c = f.channel(topic, channel);
        co_return nsqscenario::channel_view{c.depth, c.in_flight, c.deferred, c.timeout_count};
    };
    b.create_channel = [&f](std::string topic, std::string channel) -> asio::awaitable<void> {
        f.create_channel(topic, channel);
        co_return;
    };
    b.drop = [&f]() -> asio::awaitable<void> {
        f.drop_all_connections();
        co_return;
    };
    return b;
}

std::uint16_t unused_port() {
    asio::io_context io;
    asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
}

}  // namespace

BOOST_AUTO_TEST_CASE(fin_req_and_touch_are_refused_once_the_connection_is_ending) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        co_await nsqscenario::answers_are_refused_once_the_connection_is_ending(
            fake_broker(nsqd, "fake-nsqd"), "ending");
        BOOST_TEST((nsqd.fatal_errors() ==
                    std::vector<std::string>{"E_INVALID RDY count 3000 out of range 0-2500"}));
    });
}

BOOST_AUTO_TEST_CASE(a_joining_nsqd_gets_rdy_only_as_the_deliveries_in_hand_elsewhere_finish) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd a(ex), b(ex);
        BOOST_REQUIRE(a.start().has_value());
        auto b_port = unused_port();
        auto bb = fake_broker(b, "fake-nsqd B", "127.0.0.1:" + std::to_string(b_port));
        bb.start = [&b, b_port]() -> asio::awaitable<void> {
            BOOST_REQUIRE(b.start({"127.0.0.1", b_port}).has_value());
            co_return;
        };
        co_await nsqscenario::a_joining_nsqd_waits_for_deliveries_in_hand(fake_broker(a, "fake-nsqd A"), bb,
                                                                          "join");
    });
}

BOOST_AUTO_TEST_CASE(a_dropped_nsqds_running_deliveries_keep_their_budget_until_their_handlers_finish) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd a(ex), b(ex);
        BOOST_REQUIRE(a.start().has_value());
        BOOST_REQUIRE(b.start().has_value());
        co_await nsqscenario::a_dropped_nsqds_running_deliveries_keep_their_budget(
            fake_broker(a, "fake-nsqd A"), fake_broker(b, "fake-nsqd B"), "orphan");
    });
}

// A frame over max_frame_size ends the connection in the same read that brought three small messages:
// their FINs could never be written (the connection is failing), so their handlers do not run; they are
// counted as dropped and nsqd redelivers them after msg_timeout.
BOOST_AUTO_TEST_CASE(deliveries_of_a_connection_that_failed_in_their_read_are_dropped_unhandled) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.create_channel("big", "c");
        auto cfg = nsqscenario::budget_config("big", {nsqd.tcp_address()});
        cfg.max_in_flight = 10;
        cfg.max_frame_size = 64 * 1024;
        int handled = 0;
        cg::metrics::registry reg;
        cg::nsq::consumer c(
            ex, cfg,
            [&](cg::nsq::message&) -> asio::awaitable<cg::nsq::disposition> {
                ++handled;
                co_return cg::nsq::disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().total_rdy == 10; }));
        // fake-nsqd writes what one pump delivers in one write; the client reads it in one read.
        for (int i = 0; i < 3; ++i) nsqd.publish("big", "small-" + std::to_string(i));
        nsqd.publish("big", std::string(100 * 1024, 'x'));
        BOOST_REQUIRE(
            co_await eventually([&] { return c.stats().disconnects >= 1 && c.stats().dropped >= 3; }));
        BOOST_TEST(c.stats().received == 3u);
        BOOST_TEST(c.stats().dropped == 3u);
        BOOST_TEST(handled == 0);
        BOOST_TEST(c.stats().finished == 0u, "FINs counted that no loop wrote");
        BOOST_TEST(
            reg.render().find("chargeguard_nsq_messages_dropped_total{channel=\"c\",topic=\"big\"} 3") !=
            std::string::npos);
        BOOST_TEST(nsqd.channel("big", "c").in_flight == 4);  // nsqd redelivers them after msg_timeout
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(a_publish_nsqd_would_refuse_fatally_fails_alone) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        co_await nsqscenario::a_bad_publish_fails_alone(fake_broker(nsqd, "fake-nsqd"), "badpub");
        BOOST_TEST(nsqd.fatal_errors().empty());
        BOOST_TEST(nsqd.total_connections() == 1u);
    });
}

BOOST_AUTO_TEST_CASE(auth_answered_after_a_heartbeat_authenticates) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd_options o;
        o.auth_secrets["t0ken"] = fake_auth_identity{"billing", "https://auth.example/billing", 1};
        o.auth_delay = milliseconds(1500);  // > the 1 s heartbeat interval
        fake_nsqd nsqd(ex, o);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        nsqd.create_channel("authed", "c");
        co_await nsqscenario::auth_outlasting_a_heartbeat_succeeds(fake_broker(nsqd, "fake-nsqd"), "authed",
                                                                   "t0ken");
        auto log = nsqd.command_log();
        BOOST_TEST(std::count(log.begin(), log.end(), "AUTH") == 2);  // producer, consumer: once each
        BOOST_TEST(nsqd.fatal_errors().empty());
        BOOST_TEST(nsqd.heartbeat_disconnects() == 0u);
    });
}

// The double is as strict as nsqd about AUTH: nothing is accepted before it, a wrong secret is fatal.
BOOST_AUTO_TEST_CASE(fake_nsqd_with_auth_refuses_sub_and_pub_before_auth_and_a_wrong_secret) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd_options o;
        o.auth_secrets["right"] = fake_auth_identity{"id", "", 1};
        fake_nsqd nsqd(ex, o);
        BOOST_REQUIRE(nsqd.start().has_value());
        auto exchange = [&](std::string after_identify) -> asio::awaitable<std::string> {
            raw_client cl(ex);
            co_await cl.connect(nsqd.tcp_port());
            std::string out;
            cg::nsq::proto::append_magic(out);
            cg::nsq::proto::append_identify(out, R"({"feature_negotiation":true})");
            co_await cl.send(out + after_identify);
            auto identify = co_await cl.read_frame();
            BOOST_TEST(identify.find("\"auth_required\":true") != std::string::npos);
            auto reply = co_await cl.read_frame();
            co_return reply.substr(8);
        };
        std::string sub, pub, bad;
        cg::nsq::proto::append_sub(sub, "t", "c");
        cg::nsq::proto::append_pub(pub, "t", "x");
        cg::nsq::proto::append_auth(bad, "wrong");
        BOOST_TEST(co_await exchange(sub) == "E_AUTH_FIRST AUTH required before SUB");
        BOOST_TEST(co_await exchange(pub) == "E_AUTH_FIRST AUTH required before PUB");
        BOOST_TEST(co_await exchange(bad) == "E_AUTH_FAILED AUTH failed");
        std::string good;
        cg::nsq::proto::append_auth(good, "right");
        BOOST_TEST(co_await exchange(good) == R"({"identity":"id","identity_url":"","permission_count":1})");
    });
}

// A delivery waiting for a handler is kept alive from receipt. RDY keeps the deliveries outstanding
// within max_in_flight, so a queue forms only when nsqd applies a lowered RDY later than the settle delay
// assumes: here nsqd A's writes lag 1.2 s, so the two messages it sent under RDY 2 arrive after B took
// the budget A's lowered RDY freed, and one of the three waits for a handler. It is TOUCHed while it waits
// (msg_timeout / 2 after receipt, then again): nsqd never times it out.
BOOST_AUTO_TEST_CASE(a_delivery_waiting_for_a_handler_is_touched_from_receipt) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            fake_nsqd a(ex), b(ex);
            BOOST_REQUIRE(a.start().has_value());
            auto b_port = unused_port();
            auto cfg =
                nsqscenario::budget_config("lag", {a.tcp_address(), "127.0.0.1:" + std::to_string(b_port)});
            cfg.max_in_flight = 2;
            cfg.msg_timeout = milliseconds(5000);
            cfg.heartbeat_interval = milliseconds(60000);  // no heartbeat writes in the lagging stream
            a.create_channel("lag", "c");
            nsqscenario::gate g(ex);
            std::vector<int> attempts;
            cg::metrics::registry reg;
            cg::nsq::consumer c(
                ex, cfg,
                [&](cg::nsq::message& m) -> asio::awaitable<cg::nsq::disposition> {
                    cg::nsq::keepalive ka(m);
                    co_await g.pass();
                    attempts.push_back(m.attempts());
                    co_return cg::nsq::disposition::finish();
                },
                {}, reg);
            BOOST_REQUIRE(c.start().has_value());
            BOOST_REQUIRE(co_await eventually([&] { return c.stats().total_rdy == 2; }));  // A alone
            a.set_latency(milliseconds(1200));
            a.publish("lag", "a-0");
            a.publish("lag", "a-1");  // both sent at once under RDY 2, in the pipe for 1.2 s
            auto published = steady_clock::now();
            BOOST_REQUIRE(b.start({"127.0.0.1", b_port}).has_value());
            b.create_channel("lag", "c");
            b.publish("lag", "b-0");
            BOOST_REQUIRE(co_await eventually([&] { return c.stats().received == 3; }, seconds(5)));
            BOOST_REQUIRE_MESSAGE(c.stats().max_outstanding == 3u,
                                  "the scenario needs B's message before A's two (timing)");
            // Past the queued one's msg_timeout counted from when nsqd sent it (the absence of a timeout
            // cannot be awaited as an event).
            co_await cg::net::sleep_for(published + cfg.msg_timeout + milliseconds(1000) -
                                        steady_clock::now());
            g.release();
            BOOST_REQUIRE(co_await eventually([&] { return c.stats().finished == 3; }, seconds(5)));
            BOOST_TEST(a.channel("lag", "c").timeout_count == 0u);
            BOOST_TEST((attempts == std::vector<int>{1, 1, 1}));
            BOOST_TEST(c.stats().fin_failed == 0u);
            co_await c.stop();
        },
        seconds(40));
}
