// Several real nsqd behind a real nsqlookupd, and an nsqd restarted under a running consumer.
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "harness.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;

BOOST_AUTO_TEST_CASE(rdy_never_exceeds_max_in_flight_across_three_nsqd_found_through_nsqlookupd) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            real_nsqlookupd lookupd;
            co_await lookupd.start();
            std::vector<std::unique_ptr<real_nsqd>> nsqds;
            const int per = 150;
            for (int n = 0; n < 3; ++n) {
                nsqd_options o;
                o.lookupd_tcp_port = lookupd.tcp_port();
                nsqds.push_back(std::make_unique<real_nsqd>(o));
                co_await nsqds.back()->start();
                std::vector<std::string> bodies;
                for (int i = 0; i < per; ++i)
                    bodies.push_back("n" + std::to_string(n) + "-" + std::to_string(i));
                co_await nsqds.back()->http().mpub("spread", bodies);
            }
            // Every nsqd registered the topic with nsqlookupd.
            std::size_t producers = 0;
            for (auto end = steady_clock::now() + seconds(5); producers < 3 && steady_clock::now() < end;) {
                auto r = co_await http_call(lookupd.http_port(), "GET", "/lookup?topic=spread");
                producers = 0;
                for (auto p = r.body.find("\"tcp_port\""); p != std::string::npos;
                     p = r.body.find("\"tcp_port\"", p + 1))
                    ++producers;
                if (producers < 3) co_await cg::net::sleep_for(milliseconds(20));
            }
            BOOST_REQUIRE_EQUAL(producers, 3u);
            consumer_config cfg;
            cfg.topic = "spread";
            cfg.channel = "c";
            cfg.lookupd_http_addresses = {lookupd.http_address()};
            cfg.lookupd_poll_interval = milliseconds(200);
            cfg.max_in_flight = 5;  // fewer than 2 per connection: the split and the settle delay matter
            cfg.heartbeat_interval = milliseconds(1000);
            cfg.rdy_redistribute_interval = milliseconds(100);
            cfg.low_rdy_idle_timeout = milliseconds(200);
            cfg.rdy_settle_delay = milliseconds(50);
            std::map<std::string, int> seen;
            cg::metrics::registry reg;
            consumer c(
                ex, cfg,
                [&](message& m) -> asio::awaitable<disposition> {
                    ++seen[m.body()];
                    co_await cg::net::sleep_for(milliseconds(3));
                    co_return disposition::finish();
                },
                {}, reg);
            BOOST_REQUIRE(c.start().has_value());
            // Sample every nsqd's /stats (ready_count per client) until all messages are done.
            std::int64_t peak = 0, samples = 0;
            std::set<int> servers_with_rdy;
            auto end = steady_clock::now() + seconds(30);
            while (seen.size() < 3u * per && steady_clock::now() < end) {
                std::int64_t sum = 0;
                for (std::size_t i = 0; i < nsqds.size(); ++i) {
                    auto ch = co_await nsqds[i]->http().stats("spread", "c");
                    sum += ch.ready_sum();
                    if (ch.ready_sum() > 0) servers_with_rdy.insert(static_cast<int>(i));
                }
                peak = std::max(peak, sum);
                ++samples;
            }
            BOOST_TEST(seen.size() == 3u * per);
            for (const auto& [body, n] : seen) BOOST_TEST(n == 1, body << " handled " << n << " times");
            BOOST_TEST(peak <= 5, "sum of ready_count over nsqds reached " << peak);
            BOOST_TEST(samples > 5);
            BOOST_TEST(servers_with_rdy.size() == 3u);  // every nsqd got a share at some point
            BOOST_TEST(c.stats().connects == 3u);
            co_await c.stop();
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(nsqd_restarted_with_its_data_path_reconnects_and_every_message_is_finished) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            real_nsqd nsqd;
            co_await nsqd.start();
            const int total = 300;
            std::vector<std::string> bodies;
            for (int i = 0; i < total; ++i) bodies.push_back("r-" + std::to_string(i));
            co_await nsqd.http().mpub("restart", bodies);
            consumer_config cfg;
            cfg.topic = "restart";
            cfg.channel = "c";
            cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
            cfg.max_in_flight = 10;
            cfg.heartbeat_interval = milliseconds(1000);
            cfg.msg_timeout = milliseconds(5000);
            cfg.reconnect_backoff_min = milliseconds(100);
            cfg.reconnect_backoff_max = milliseconds(500);
            std::map<std::string, int> seen;
            cg::metrics::registry reg;
            consumer c(
                ex, cfg,
                [&](message& m) -> asio::awaitable<disposition> {
                    ++seen[m.body()];
                    co_await cg::net::sleep_for(milliseconds(4));
                    co_return disposition::finish();
                },
                {}, reg);
            BOOST_REQUIRE(c.start().has_value());
            BOOST_REQUIRE(co_await eventually([&] { return c.stats().finished >= 60; }, seconds(10)));
            // SIGTERM: nsqd writes its queue and its in-flight messages to the data path; same ports again.
            co_await nsqd.restart();
            BOOST_REQUIRE(co_await eventually([&] { return seen.size() == static_cast<std::size_t>(total); },
                                              seconds(20)));
            BOOST_REQUIRE(co_await eventually(
                [&] { return c.stats().connects == 2 && c.subscribed_connections() == 1; }, seconds(5)));
            // nsqd's view after the restart: nothing left, nothing in flight, nothing timed out.
            channel_stats ch;
            auto end = steady_clock::now() + seconds(5);
            do {
                ch = co_await nsqd.http().stats("restart", "c");
            } while ((ch.depth != 0 || ch.in_flight_count != 0) && steady_clock::now() < end);
            BOOST_TEST(ch.depth == 0);
            BOOST_TEST(ch.in_flight_count == 0);
            BOOST_TEST(ch.timeout_count == 0u);
            // Exactly once except what was in flight at the SIGTERM (nsqd persisted it; the FINs we sent
            // for it were lost with the connection): at most max_in_flight redeliveries.
            int twice = 0;
            for (const auto& [body, n] : seen) {
                BOOST_TEST(n >= 1);
                BOOST_TEST(n <= 2, body);
                if (n == 2) ++twice;
            }
            BOOST_TEST(twice <= 10, twice << " messages handled twice");
            BOOST_TEST(c.stats().disconnects >= 1u);
            co_await c.stop();
        },
        seconds(60));
}
