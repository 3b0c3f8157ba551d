// The consumer against fake-nsqd (consumer_fixture.hpp): max_handlers with handlers held up or not, nsqd
// restarted, RDY rotated across more connections than max_in_flight, the drain on stop, max_attempts and the
// give-up handler, a throwing handler, a silent nsqd dropped after two heartbeats, a bad msg_timeout.
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "consumer_fixture.hpp"
#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "nsq/proto/error.hpp"
#include "tests/support/run_async.hpp"

// max_handlers below max_in_flight, held up downstream: every message is delivered at once (RDY follows
// max_in_flight), only that many handlers run, the rest wait queued and are TOUCHed there (held past
// msg_timeout, none times out), then all are finished. Not held up: every delivery gets a handler.
void run_max_handlers_case(bool held_up) {
    cg::test::run_async([held_up]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        for (int i = 0; i < 20; ++i) nsqd.publish("mh", "m" + std::to_string(i));
        auto cfg = base_config("mh");
        cfg.max_in_flight = 20;
        cfg.max_handlers = 4;
        cfg.held_up = [held_up] { return held_up; };
        cfg.msg_timeout = milliseconds(1000);
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cg::net::steady_timer gate(ex, steady_clock::time_point::max());
        int running = 0;
        bool open = false;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                cg::nsq::keepalive alive(m);  // as the billing handler keeps its message alive
                ++running;
                if (!open) co_await gate.async_wait();  // held until the test opens the gate
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        const int bound = held_up ? 4 : 20;
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().received == 20 && running == bound; }));
        co_await cg::net::sleep_for(milliseconds(1600));  // past msg_timeout with the rest queued
        BOOST_TEST(running == bound);
        BOOST_TEST(nsqd.channel("mh", "billing").in_flight == 20);
        open = true;
        gate.cancel();
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("mh", "billing").finish_count == 20; }));
        BOOST_TEST(c.stats().max_handlers == static_cast<std::uint64_t>(bound));
        BOOST_TEST(nsqd.channel("mh", "billing").timeout_count == 0u);
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(max_handlers_bounds_the_handlers_held_up_and_the_rest_wait_queued_alive) {
    run_max_handlers_case(true);
}

BOOST_AUTO_TEST_CASE(max_handlers_does_not_bound_handlers_that_are_not_held_up) {
    run_max_handlers_case(false);
}

BOOST_AUTO_TEST_CASE(restart_of_nsqd_reconnects_and_resumes) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        const int n = 2000;
        for (int i = 0; i < n; ++i) nsqd.publish("rs", std::to_string(i));
        auto cfg = base_config("rs");
        cfg.max_in_flight = 100;
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        std::set<std::string> done;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                co_await cg::net::sleep_for(milliseconds(1));
                done.insert(m.body());
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().received >= 500; }));
        nsqd.restart();
        BOOST_REQUIRE(co_await eventually(
            [&] {
                return nsqd.channel("rs", "billing").finish_count >= n &&
                       nsqd.channel("rs", "billing").depth == 0 &&
                       nsqd.channel("rs", "billing").in_flight == 0;
            },
            seconds(20)));
        BOOST_TEST(done.size() == static_cast<std::size_t>(n));
        BOOST_TEST(nsqd.total_connections() >= 2u);
        BOOST_TEST(c.stats().connects >= 2u);
        BOOST_TEST(c.stats().disconnects >= 1u);
        BOOST_TEST(c.subscribed_connections() == 1u);
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(rdy_rotates_when_connections_outnumber_max_in_flight) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto ledger = std::make_shared<rdy_ledger>();
        ledger->limit = 2;
        std::vector<std::unique_ptr<fake_nsqd>> nsqds;
        auto cfg = base_config("rot");
        cfg.max_in_flight = 2;
        for (int n = 0; n < 4; ++n) {
            fake_nsqd_options o;
            o.ledger = ledger;
            nsqds.push_back(std::make_unique<fake_nsqd>(ex, o));
            BOOST_REQUIRE(nsqds.back()->start().has_value());
            for (int i = 0; i < 15; ++i) nsqds.back()->publish("rot", std::to_string(n * 100 + i));
            cfg.nsqd_tcp_addresses.push_back(nsqds.back()->tcp_address());
        }
        std::set<std::string> got;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                got.insert(m.body());
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        // The handler sees the last message before its FIN reaches nsqd: wait for the FINs too.
        BOOST_REQUIRE(co_await eventually(
            [&] {
                if (got.size() != 60u) return false;
                for (auto& n : nsqds)
                    if (n->channel("rot", "billing").finish_count != 15u) return false;
                return true;
            },
            seconds(20)));
        BOOST_TEST(ledger->violations == 0u);
        BOOST_TEST(ledger->peak <= 2);
        BOOST_TEST(c.stats().max_handlers <= 2u);
        for (auto& n : nsqds) BOOST_TEST(n->channel("rot", "billing").finish_count == 15u);
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(stop_drains_in_flight_handlers_then_closes) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        for (int i = 0; i < 300; ++i) nsqd.publish("dr", std::to_string(i));
        auto cfg = base_config("dr");
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cg::metrics::registry reg;
        cg::metrics::health health;
        consumer c(
            ex, cfg,
            [&](message&) -> asio::awaitable<disposition> {
                co_await cg::net::sleep_for(milliseconds(300));
                co_return disposition::finish();
            },
            {}, reg);
        c.add_readiness(health);
        BOOST_TEST(!health.ready().ok);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().received >= 60; }));
        BOOST_TEST(health.ready().ok);
        co_await c.stop();
        // stop() ends when our side closed; nsqd reads the last FINs before it sees the close.
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.client_count() == 0; }));
        auto ch = nsqd.channel("dr", "billing");
        BOOST_TEST(c.stats().finished == c.stats().received);
        BOOST_TEST(ch.finish_count == c.stats().received);
        BOOST_TEST(ch.in_flight == 0);
        BOOST_TEST(ch.timeout_count == 0u);
        BOOST_TEST(ch.requeue_count == 0u);
        BOOST_TEST(ch.depth == static_cast<std::int64_t>(300 - c.stats().received));
        BOOST_TEST(!health.ready().ok);
        auto log = nsqd.command_log();
        auto rdy0 = std::find(log.begin(), log.end(), "RDY 0");
        auto cls = std::find(log.begin(), log.end(), "CLS");
        BOOST_REQUIRE((rdy0 != log.end()));
        BOOST_REQUIRE((cls != log.end()));
        BOOST_TEST((rdy0 < cls));
    });
}

BOOST_AUTO_TEST_CASE(past_max_attempts_goes_to_the_give_up_handler_then_fin) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("ga", "poison");
        auto cfg = base_config("ga");
        cfg.max_attempts = 2;
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        int handled = 0;
        std::vector<std::pair<std::string, int>> given_up;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message&) -> asio::awaitable<disposition> {
                ++handled;
                co_return disposition::requeue_without_backoff(milliseconds(0));
            },
            {}, reg);
        c.set_give_up_handler([&](message& m) -> asio::awaitable<disposition> {
            given_up.emplace_back(m.body(), m.attempts());
            co_return disposition::finish();
        });
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("ga", "billing").finish_count == 1; }));
        BOOST_TEST(handled == 2);
        BOOST_REQUIRE(given_up.size() == 1u);
        BOOST_TEST(given_up[0].first == "poison");
        BOOST_TEST(given_up[0].second == 3);
        BOOST_TEST(c.stats().gave_up == 1u);
        co_await c.stop();
    });
}

// A give-up handler keeps a message by its disposition (the billing layer does so for every valid event):
// the consumer REQs it with the handler's delay, counts no give-up, and does not enter handler backoff.
BOOST_AUTO_TEST_CASE(a_give_up_handler_keeps_a_message_by_requeueing_it_without_backoff) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("gk", "valid");
        auto cfg = base_config("gk");
        cfg.max_attempts = 1;
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        std::vector<int> seen;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                seen.push_back(m.attempts());
                co_return disposition::requeue_without_backoff(milliseconds(0));
            },
            {}, reg);
        c.set_give_up_handler([&](message& m) -> asio::awaitable<disposition> {
            seen.push_back(m.attempts());
            if (m.attempts() < 4) co_return disposition::requeue_without_backoff(milliseconds(0));
            co_return disposition::finish();
        });
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("gk", "billing").finish_count == 1; }));
        BOOST_TEST((seen == std::vector<int>{1, 2, 3, 4}));
        BOOST_TEST(nsqd.channel("gk", "billing").requeue_count == 3u);
        BOOST_TEST(c.stats().gave_up == 1u);  // only the delivery that was finished
        BOOST_TEST(c.stats().handler_errors == 0u);
        BOOST_TEST(c.stats().total_rdy > 0u);  // never backed off to RDY 0
        co_await c.stop();
    });
}

// A handler that throws has a bug: the message is not lost (REQ), the error is counted and exported.
BOOST_AUTO_TEST_CASE(a_throwing_handler_is_counted_and_its_message_requeued) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.publish("gt", "boom");
        auto cfg = base_config("gt");
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cfg.default_requeue_delay = milliseconds(0);
        int calls = 0;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message&) -> asio::awaitable<disposition> {
                if (++calls == 1) throw std::runtime_error("handler bug");
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("gt", "billing").finish_count == 1; },
                                          seconds(10)));
        BOOST_TEST(calls == 2);
        BOOST_TEST(c.stats().handler_errors == 1u);
        BOOST_TEST(nsqd.channel("gt", "billing").requeue_count == 1u);
        BOOST_TEST(
            reg.render().find("chargeguard_nsq_handler_errors_total{channel=\"billing\",topic=\"gt\"} 1") !=
            std::string::npos);
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(a_silent_nsqd_is_dropped_after_two_heartbeats_and_reconnected) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        auto cfg = base_config("fz");
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cg::metrics::registry reg;
        consumer c(ex, cfg, finish_now, {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.subscribed_connections() == 1; }));
        nsqd.freeze(true);
        auto t0 = steady_clock::now();
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().disconnects == 1; }, seconds(6)));
        auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
        BOOST_TEST(took >= 1000);  // not before a heartbeat was due
        BOOST_TEST(took <= 3500);  // 2 × heartbeat_interval plus the watchdog's granularity and slack
        nsqd.freeze(false);
        BOOST_REQUIRE(
            co_await eventually([&] { return c.stats().connects >= 2 && c.subscribed_connections() == 1; }));
        nsqd.publish("fz", "after");
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("fz", "billing").finish_count == 1; }));
        co_await c.stop();
    });
}

BOOST_AUTO_TEST_CASE(bad_msg_timeout_is_refused_before_connecting) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        auto cfg = base_config("bad");
        cfg.msg_timeout = milliseconds(999);
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cg::metrics::registry reg;
        consumer c(ex, cfg, finish_now, {}, reg);
        auto r = c.start();
        BOOST_REQUIRE(!r.has_value());
        BOOST_TEST((r.code() == cg::nsq::errc::bad_config));
        BOOST_TEST(r.err().message.find("msg_timeout 999 ms is out of range") != std::string::npos);
        co_await cg::net::sleep_for(milliseconds(100));
        BOOST_TEST(nsqd.total_connections() == 0u);
    });
}
