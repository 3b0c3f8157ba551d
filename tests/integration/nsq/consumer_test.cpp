// The consumer against fake-nsqd: exactly-once delivery across 3 nsqd found through lookupd, requeue
// and backoff, keepalive vs. redelivery, heartbeats under 2 500 in flight, restart/reconnect, RDY
// bounds asserted inside the double, graceful drain, max_attempts, readiness.
#include "nsq/consumer.hpp"

#include <algorithm>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "nsq/proto/error.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;

namespace {

consumer_config base_config(const std::string& topic) {
    consumer_config c;
    c.topic = topic;
    c.channel = "billing";
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(2000);
    c.max_in_flight = 50;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(400);
    c.backoff_multiplier = milliseconds(20);
    c.max_backoff_duration = milliseconds(200);
    c.lookupd_poll_interval = milliseconds(200);
    c.rdy_redistribute_interval = milliseconds(100);
    c.low_rdy_idle_timeout = milliseconds(200);
    c.rdy_settle_delay = milliseconds(20);
    c.drain_timeout = milliseconds(5000);
    return c;
}

asio::awaitable<disposition> finish_now(message&) {
    co_return disposition::finish();
}

}  // namespace

BOOST_AUTO_TEST_CASE(messages_across_three_nsqd_via_lookupd_arrive_exactly_once) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto ledger = std::make_shared<rdy_ledger>();
        ledger->limit = 50;
        fake_nsqlookupd lookupd(ex);
        BOOST_REQUIRE(lookupd.start().has_value());
        std::vector<std::unique_ptr<fake_nsqd>> nsqds;
        const int per = 400;
        for (int n = 0; n < 3; ++n) {
            fake_nsqd_options o;
            o.ledger = ledger;
            o.max_channel_rdy = 50;
            nsqds.push_back(std::make_unique<fake_nsqd>(ex, o));
            BOOST_REQUIRE(nsqds.back()->start().has_value());
            for (int i = 0; i < per; ++i)
                nsqds.back()->publish("events", "n" + std::to_string(n) + "-" + std::to_string(i));
            lookupd.add_producer("events", nsqds.back()->producer());
        }
        auto cfg = base_config("events");
        cfg.lookupd_http_addresses = {"http://" + lookupd.http_address(), lookupd.http_address()};
        std::map<std::string, int> seen;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                ++seen[m.body()];
                BOOST_CHECK_EQUAL(m.id().size(), 16u);
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        auto done = [&] {
            std::uint64_t fin = 0;
            for (auto& n : nsqds) fin += n->channel("events", "billing").finish_count;
            return fin == 3u * per;
        };
        BOOST_REQUIRE(co_await eventually(done, seconds(20)));
        BOOST_TEST(seen.size() == 3u * per);
        for (auto& [body, count] : seen) BOOST_TEST(count == 1, body);
        BOOST_TEST(c.stats().finished == 3u * per);
        BOOST_TEST(c.stats().fin_failed == 0u);
        BOOST_TEST(c.subscribed_connections() == 3u);
        BOOST_TEST(ledger->violations == 0u);
        BOOST_TEST(ledger->peak <= 50);
        BOOST_TEST(c.stats().max_total_rdy <= 50u);
        BOOST_TEST(c.stats().max_handlers <= 50u);
        for (auto& n : nsqds) {
            BOOST_TEST(n->rdy_violations() == 0u);
            BOOST_TEST(n->fatal_errors().empty());
        }
        BOOST_TEST(lookupd.lookups() >= 2u);
        co_await c.stop();
        for (auto& n : nsqds)
            BOOST_TEST(
                co_await eventually([&] { return n->channel("events", "billing").client_count == 0; }));
        auto text = reg.render();
        BOOST_TEST(
            text.find("chargeguard_nsq_messages_finished_total{channel=\"billing\",topic=\"events\"} 1200") !=
            std::string::npos);
    });
}

BOOST_AUTO_TEST_CASE(requeue_redelivers_with_growing_attempts_and_backs_off) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        nsqd.publish("rq", "only");
        auto cfg = base_config("rq");
        cfg.max_in_flight = 10;
        // Attempt 2 is redelivered at once (the REQ has no delay) and must fail inside the first backoff
        // window, as it would against nsqd; a window of a few ms could close first on a loaded machine,
        // and then (as in go-nsq) the level would not return to 0 with no messages left to succeed.
        cfg.backoff_multiplier = milliseconds(300);
        cfg.max_backoff_duration = milliseconds(2000);
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        std::vector<int> attempts;
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                attempts.push_back(m.attempts());
                if (m.attempts() < 3) co_return disposition::requeue(milliseconds(0));
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("rq", "billing").finish_count == 1; }));
        BOOST_TEST((attempts == std::vector<int>{1, 2, 3}));
        BOOST_TEST(nsqd.channel("rq", "billing").requeue_count == 2u);
        BOOST_TEST(c.stats().requeued == 2u);
        // go-nsq backoff: RDY 0 after the failure, then RDY 1 to test, then full RDY once it succeeds.
        BOOST_REQUIRE(co_await eventually([&] {
            auto log = nsqd.command_log();
            return !log.empty() && log.back() == "RDY 10";
        }));
        auto log = nsqd.command_log();
        std::vector<std::string> rdys;
        for (auto& l : log)
            if (l.rfind("RDY", 0) == 0) rdys.push_back(l);
        BOOST_REQUIRE(rdys.size() >= 4u);
        BOOST_TEST(rdys.front() == "RDY 10");
        auto zero = std::find(rdys.begin(), rdys.end(), "RDY 0");
        BOOST_REQUIRE((zero != rdys.end()));
        auto one = std::find(zero, rdys.end(), "RDY 1");
        BOOST_REQUIRE((one != rdys.end()));
        BOOST_TEST((std::find(one, rdys.end(), "RDY 10") != rdys.end()));
        co_await c.stop();
    });
}

namespace {

// A handler that takes 3 × msg_timeout; with_keepalive decides whether it holds a keepalive meanwhile.
asio::awaitable<disposition> slow_handler(message& m, bool with_keepalive, std::vector<int>& attempts) {
    attempts.push_back(m.attempts());
    if (m.attempts() > 1) co_return disposition::finish();
    if (with_keepalive) {
        cg::nsq::keepalive ka(m);
        co_await cg::net::sleep_for(milliseconds(3000));
    } else {
        co_await cg::net::sleep_for(milliseconds(3000));
    }
    co_return disposition::finish();
}

asio::awaitable<void> run_slow(bool with_keepalive) {
    auto ex = co_await asio::this_coro::executor;
    fake_nsqd nsqd(ex);
    BOOST_REQUIRE(nsqd.start().has_value());
    for (int i = 0; i < 3; ++i) nsqd.publish("slow", "m" + std::to_string(i));
    auto cfg = base_config("slow");
    cfg.msg_timeout = milliseconds(1000);
    cfg.max_in_flight = 10;
    cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
    std::vector<int> attempts;
    cg::metrics::registry reg;
    consumer c(
        ex, cfg, [&](message& m) { return slow_handler(m, with_keepalive, attempts); }, {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    // With keepalive: three FINs accepted. Without: the late FINs of attempt 1 come back E_FIN_FAILED.
    BOOST_REQUIRE(co_await eventually(
        [&] {
            return nsqd.channel("slow", "billing").finish_count == 3 &&
                   (with_keepalive ? c.stats().finished == 3 : c.stats().fin_failed == 3);
        },
        seconds(8)));
    auto ch = nsqd.channel("slow", "billing");
    if (with_keepalive) {
        BOOST_TEST(ch.timeout_count == 0u);
        BOOST_TEST((attempts == std::vector<int>{1, 1, 1}));
        BOOST_TEST(c.stats().fin_failed == 0u);
        BOOST_TEST(c.stats().touches >= 3u * 4u);  // every 500 ms for 3 s, per message
    } else {
        BOOST_TEST(ch.timeout_count >= 3u);
        BOOST_TEST(std::count(attempts.begin(), attempts.end(), 2) == 3);
        BOOST_TEST(c.stats().fin_failed == 3u);  // the late FINs of attempt 1
    }
    co_await c.stop();
}

}  // namespace

BOOST_AUTO_TEST_CASE(keepalive_holds_a_slow_message_without_redelivery) {
    cg::test::run_async([]() { return run_slow(true); });
}

BOOST_AUTO_TEST_CASE(without_keepalive_a_slow_message_is_redelivered) {
    cg::test::run_async([]() { return run_slow(false); });
}

BOOST_AUTO_TEST_CASE(heartbeats_answered_while_2500_messages_are_in_flight) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        for (int i = 0; i < 2500; ++i) nsqd.publish("hb", "m" + std::to_string(i));
        auto cfg = base_config("hb");
        cfg.max_in_flight = 2500;
        cfg.msg_timeout = milliseconds(10000);
        cfg.nsqd_tcp_addresses = {nsqd.tcp_address()};
        cg::net::steady_timer gate(ex, steady_clock::time_point::max());
        cg::metrics::registry reg;
        consumer c(
            ex, cfg,
            [&](message&) -> asio::awaitable<disposition> {
                co_await gate.async_wait();  // held until the test opens the gate
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().received == 2500; }));
        BOOST_TEST(nsqd.channel("hb", "billing").in_flight == 2500);
        co_await cg::net::sleep_for(milliseconds(2600));  // > 2 heartbeat intervals with everything in flight
        BOOST_TEST(nsqd.heartbeat_disconnects() == 0u);
        BOOST_TEST(c.stats().disconnects == 0u);
        auto log = nsqd.command_log();
        BOOST_TEST(std::count(log.begin(), log.end(), "NOP") >= 2);
        gate.cancel();
        BOOST_REQUIRE(
            co_await eventually([&] { return nsqd.channel("hb", "billing").finish_count == 2500; }));
        BOOST_TEST(c.stats().max_handlers == 2500u);
        BOOST_TEST(nsqd.total_connections() == 1u);
        BOOST_TEST(nsqd.channel("hb", "billing").timeout_count == 0u);
        co_await c.stop();
    });
}

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
