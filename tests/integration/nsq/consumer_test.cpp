// The consumer against fake-nsqd: exactly-once delivery across 3 nsqd found through lookupd, requeue
// and backoff, keepalive vs. redelivery, heartbeats under 2 500 in flight, restart/reconnect, RDY
// bounds asserted inside the double, graceful drain, max_attempts, readiness.
// Delivery here (consumer_fixture.hpp); handlers bounded, restarts, drain, attempts and liveness are
// consumer_lifecycle_test.cpp.
#include "nsq/consumer.hpp"

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
