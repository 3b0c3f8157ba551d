// The consumer against fake-nsqd (consumer_fixture.hpp): how soon a wave of deliveries read together gets its
// handlers, counted in turns of the event loop.
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "consumer_fixture.hpp"
#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/registry.hpp"
#include "net/tokens.hpp"
#include "nsq/consumer.hpp"
#include "tests/support/run_async.hpp"

// A wave of deliveries read together starts all its handlers within a few turns of the event loop: each
// queued message gets a worker woken or started at once, not one after the other (a wake or a start is a
// completion queued behind the loop's next poll, so one per message would be a turn per message).
BOOST_AUTO_TEST_CASE(a_wave_of_deliveries_starts_its_handlers_in_a_few_loop_turns) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        constexpr int n = 200;
        auto cfg = base_config("wave");
        cfg.max_in_flight = n;
        cfg.msg_timeout = milliseconds(10000);
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        // Counts the loop's turns: re-posted from itself, it runs once after each poll.
        std::uint64_t turn = 0;
        bool ticking = true, ticker_done = false;
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
                while (ticking) {
                    ++turn;
                    co_await asio::post(ex, asio::use_awaitable);
                }
            },
            [&](std::exception_ptr) { ticker_done = true; });
        cg::net::steady_timer gate(ex, steady_clock::time_point::max());
        std::vector<std::uint64_t> started;  // the turn each handler started in
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message&) -> asio::awaitable<disposition> {
                started.push_back(turn);
                co_await gate.async_wait();  // held until every delivery of the wave has its handler
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        std::uint64_t finished_before = 0;
        auto wave = [&](const char* prefix) -> asio::awaitable<std::uint64_t> {
            started.clear();
            for (int i = 0; i < n; ++i) nsqd.publish("wave", prefix + std::to_string(i));
            const bool all =
                co_await eventually([&] { return started.size() == static_cast<std::size_t>(n); });
            BOOST_REQUIRE(all);
            auto [lo, hi] = std::minmax_element(started.begin(), started.end());
            const auto spread = *hi - *lo;
            gate.cancel();
            finished_before += n;
            const bool finished = co_await eventually([&] { return c.stats().finished == finished_before; });
            BOOST_REQUIRE(finished);
            co_return spread;
        };
        // Workers started for the first wave, then the same workers woken (parked) for the second.
        const auto first = co_await wave("a");
        const auto second = co_await wave("b");
        BOOST_TEST(first < static_cast<std::uint64_t>(n / 4),
                   "the first wave's handlers started over " << first << " turns");
        BOOST_TEST(second < static_cast<std::uint64_t>(n / 4),
                   "the second wave's handlers started over " << second << " turns");
        co_await c.stop();
        ticking = false;
        BOOST_REQUIRE(co_await eventually([&] { return ticker_done; }));
    });
}
