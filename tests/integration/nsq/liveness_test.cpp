// Liveness gaps of the consumer (and producer) found by reading the code, each shown against fake-nsqd:
// a backoff that stalled for ever when its trial connection dropped, only the first resolved address
// tried, the first TOUCH timed from handler start instead of receipt (also when keepalives share their
// connection's timer), and a background task whose exception was swallowed so its nsqd was never
// reconnected.
#include <boost/test/unit_test.hpp>
#include <stdexcept>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "nsq/producer.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;

namespace {

consumer_config liveness_config(const std::string& topic, const std::string& address) {
    consumer_config c;
    c.topic = topic;
    c.channel = "c";
    c.nsqd_tcp_addresses = {address};
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(2000);
    c.max_in_flight = 1;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(200);
    c.backoff_multiplier = milliseconds(100);
    c.max_backoff_duration = milliseconds(1000);
    c.rdy_redistribute_interval = milliseconds(100);
    c.drain_timeout = milliseconds(3000);
    return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(backoff_recovers_when_the_trial_rdy_connection_drops) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        nsqd.publish("bo", "fail-me");
        std::vector<std::string> handled;
        cg::metrics::registry reg;
        consumer c(
            ex, liveness_config("bo", nsqd.tcp_address()),
            [&](message& m) -> asio::awaitable<disposition> {
                handled.push_back(m.body());
                // A failure (backoff), and a long delay so nothing comes back to the trial RDY 1.
                if (m.body() == "fail-me") co_return disposition::requeue(seconds(60));
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        // RDY 1 → failure → RDY 0 → backoff timer → trial RDY 1.
        BOOST_REQUIRE(co_await eventually(
            [&] {
                auto log = nsqd.command_log();
                auto zero = std::find(log.begin(), log.end(), "RDY 0");
                return zero != log.end() && std::find(zero, log.end(), "RDY 1") != log.end();
            },
            seconds(5)));
        // The connection holding the trial drops; the consumer reconnects while still backing off.
        nsqd.drop_all_connections();
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().connects == 2; }, seconds(5)));
        nsqd.publish("bo", "ok-after-drop");
        // A new trial must go out on the new connection; before the fix RDY stayed 0 for ever.
        BOOST_TEST(co_await eventually([&] { return c.stats().finished == 1; }, seconds(5)),
                   "the consumer never tested again after its trial connection dropped");
        BOOST_TEST((handled == std::vector<std::string>{"fail-me", "ok-after-drop"}));
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(every_resolved_address_is_tried_by_consumer_and_producer) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        // "nsqd.test" resolves to ::1 first (nothing listens there: refused), then to 127.0.0.1.
        std::vector<std::string> asked;
        auto resolver = [&asked](const std::string& host) {
            asked.push_back(host);
            return std::vector<std::string>{"::1", "127.0.0.1"};
        };
        auto address = "nsqd.test:" + std::to_string(nsqd.tcp_port());
        cg::nsq::producer_config pc;
        pc.resolver = resolver;
        cg::nsq::producer prod(ex, address, pc, {});
        auto r = co_await prod.publish("multi", "via-second-address");
        BOOST_TEST(r.has_value(), (r ? "" : r.err().describe()));
        co_await prod.close();
        auto cfg = liveness_config("multi", address);
        cfg.resolver = resolver;
        std::vector<std::string> got;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                got.push_back(m.body());
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_TEST(co_await eventually([&] { return got.size() == 1; }, seconds(5)));
        BOOST_TEST(c.stats().connects == 1u);
        BOOST_TEST(asked.size() >= 2u);
        BOOST_TEST(asked.front() == "nsqd.test");
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(first_touch_is_timed_from_receipt_not_from_keepalive_start) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("recv", "late-keepalive");
        std::vector<int> attempts;
        cg::metrics::registry reg;
        // msg_timeout 2 s. The handler works 1.2 s before it holds a keepalive, then 1.5 s more: timed
        // from the keepalive's start, the first TOUCH would come at 2.2 s — after nsqd's deadline.
        consumer c(
            ex, liveness_config("recv", nsqd.tcp_address()),
            [&](message& m) -> asio::awaitable<disposition> {
                attempts.push_back(m.attempts());
                if (m.attempts() > 1) co_return disposition::finish();
                co_await cg::net::sleep_for(milliseconds(1200));
                cg::nsq::keepalive ka(m);
                co_await cg::net::sleep_for(milliseconds(1500));
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(
            co_await eventually([&] { return nsqd.channel("recv", "c").finish_count == 1; }, seconds(6)));
        co_await cg::net::sleep_for(milliseconds(200));
        BOOST_TEST(nsqd.channel("recv", "c").timeout_count == 0u);
        BOOST_TEST((attempts == std::vector<int>{1}));
        BOOST_TEST(c.stats().fin_failed == 0u);
        co_await c.stop();
    });
}

// A connection's keepalives share one timer, armed for the earliest TOUCH due among them. A keepalive that
// joins later but is due sooner (its message came first) must move that timer earlier: here "early" (received
// at 0) holds its keepalive only once "late" (received at 1.2 s) armed the timer for 2.2 s — past early's
// deadline at 2 s.
BOOST_AUTO_TEST_CASE(a_keepalive_due_before_the_connections_touch_timer_moves_it_earlier) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("shared", "early");
        std::vector<std::pair<std::string, int>> seen;
        std::size_t early_touches = 0, late_touches = 0;
        auto cfg = liveness_config("shared", nsqd.tcp_address());
        cfg.max_in_flight = 2;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                seen.emplace_back(m.body(), m.attempts());
                if (m.attempts() > 1) co_return disposition::finish();
                if (m.body() == "early") {
                    // Once "late" is being handled: its handler holds its keepalive from its first step.
                    bool late_started = co_await eventually([&] { return seen.size() == 2; }, seconds(3));
                    BOOST_TEST(late_started);
                    cg::nsq::keepalive ka(m);
                    co_await cg::net::sleep_for(milliseconds(1500));
                    early_touches = ka.touches();
                } else {
                    cg::nsq::keepalive ka(m);
                    co_await cg::net::sleep_for(milliseconds(2500));
                    late_touches = ka.touches();
                }
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        co_await cg::net::sleep_for(milliseconds(1200));
        nsqd.publish("shared", "late");
        BOOST_REQUIRE(
            co_await eventually([&] { return nsqd.channel("shared", "c").finish_count == 2; }, seconds(8)));
        co_await cg::net::sleep_for(milliseconds(200));
        BOOST_TEST(nsqd.channel("shared", "c").timeout_count == 0u);
        BOOST_TEST(seen.size() == 2u);
        for (const auto& [body, attempts] : seen) BOOST_TEST(attempts == 1, body << " delivered again");
        BOOST_TEST(early_touches >= 2u);  // at once (due since 1 s), then 1 s later
        BOOST_TEST(late_touches >= 2u);   // at 2.2 s and 3.2 s
        BOOST_TEST(c.stats().fin_failed == 0u);
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(a_supervisor_that_throws_is_logged_and_restarted_not_lost) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("sup", "after-restart");
        auto cfg = liveness_config("sup", "nsqd.test:" + std::to_string(nsqd.tcp_port()));
        int calls = 0;
        // A bug stand-in: the first lookup throws out of the supervisor's coroutine.
        cfg.resolver = [&calls](const std::string&) -> std::vector<std::string> {
            if (++calls == 1) throw std::runtime_error("resolver bug");
            return {"127.0.0.1"};
        };
        auto sink = std::make_shared<cg::memory_sink>();
        std::vector<std::string> got;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                got.push_back(m.body());
                co_return disposition::finish();
            },
            cg::logger(sink, cg::log_level::info), reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_TEST(co_await eventually([&] { return got.size() == 1; }, seconds(5)),
                   "the nsqd was never connected after its supervisor threw");
        BOOST_TEST(c.stats().task_restarts == 1u);
        BOOST_TEST(sink->contains("consumer task failed: restarting it"));
        BOOST_TEST(sink->contains("resolver bug"));
        co_await c.stop();
    });
}
