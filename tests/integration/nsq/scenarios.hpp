// Scenarios both NSQ suites run: tests/integration/nsq against fake-nsqd, tests/integration/nsq_real
// against nsqd 1.3.0 (and fake-nsqd again, side by side). Each reaches its brokers through `broker`, so the
// same steps and the same assertions meet both.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/ip/address.hpp>
#include <asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "metrics/registry.hpp"
#include "net/address.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsq/connection.hpp"
#include "nsq/consumer.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/error.hpp"

namespace nsqscenario {

using namespace std::chrono;

struct channel_view {
    std::int64_t depth = 0, in_flight = 0, deferred = 0;
    std::uint64_t timeout_count = 0;
};

struct broker {
    std::string name;
    std::string tcp_address;
    std::function<asio::awaitable<void>(std::string topic, std::vector<std::string> bodies)> publish;
    std::function<asio::awaitable<channel_view>(std::string topic, std::string channel)> channel;
    std::function<asio::awaitable<void>(std::string topic, std::string channel)> create_channel;
    std::function<asio::awaitable<void>()> start;  // a broker that comes up during the scenario
    std::function<asio::awaitable<void>()> drop;   // ends every client connection (nsqd: its exit)
};

// Polls `cond` every 5 ms on a timer until true; false after `limit`.
inline asio::awaitable<bool> wait_for(std::function<bool()> cond, milliseconds limit) {
    auto end = steady_clock::now() + limit;
    while (!cond()) {
        if (steady_clock::now() > end) co_return false;
        co_await cg::net::sleep_for(milliseconds(5));
    }
    co_return true;
}

inline std::vector<std::string> bodies(const std::string& prefix, int n) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
    return out;
}

// Handlers wait here until the test opens it.
struct gate {
    explicit gate(asio::any_io_executor ex) : timer(ex, steady_clock::time_point::max()) {}
    cg::net::steady_timer timer;
    bool open = false;
    asio::awaitable<void> pass() {
        while (!open) co_await timer.async_wait(cg::net::nothrow);
    }
    void release() {
        open = true;
        timer.cancel();
    }
};

// --- FIN/REQ/TOUCH on a connection that is ending -------------------------------------------------------

// Records a connection's deliveries and, in the read batch of the fatal error frame (the connection has
// failed but not closed yet), tries to answer them.
struct ending_owner final : cg::nsq::connection_owner {
    std::vector<cg::nsq::delivery_ticket> tickets;
    bool fatal = false, tried = false;
    bool answerable = true, fin = true, req = true, touch = true;
    cg::nsq::connection::phase phase_then = cg::nsq::connection::phase::closed;
    void on_subscribed(cg::nsq::connection&) override {}
    void on_message(const std::shared_ptr<cg::nsq::connection>&, const cg::nsq::proto::message_view&,
                    cg::nsq::delivery_ticket t) override {
        tickets.push_back(t);
    }
    void on_read_batch(cg::nsq::connection& c) override {
        if (!fatal || tried || tickets.size() < 3) return;
        tried = true;
        phase_then = c.state();
        answerable = c.can_answer(tickets[0]);
        fin = c.finish(tickets[0]);
        req = c.requeue(tickets[1], milliseconds(0));
        touch = c.touch(tickets[2]);
    }
    void on_error_frame(cg::nsq::connection&, const cg::nsq::proto::error_frame& e) override {
        if (e.fatal) fatal = true;
    }
    void on_touch_sent() override {}
};

// A fatal error frame ends the connection, but its loops unwind over a few executor turns before the
// phase is `closed`. A FIN, REQ or TOUCH accepted then would be queued and never written, and counted as
// sent: each must be refused from the moment the connection failed.
inline asio::awaitable<void> answers_are_refused_once_the_connection_is_ending(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    co_await b.create_channel(topic, "c");
    co_await b.publish(topic, bodies("end-", 3));
    cg::nsq::consumer_config cfg;
    cfg.topic = topic;
    cfg.channel = "c";
    cfg.heartbeat_interval = milliseconds(1000);
    cfg.max_in_flight = 3;
    ending_owner owner;
    auto conn = std::make_shared<cg::nsq::connection>(ex, b.tcp_address, cfg, &owner, cg::logger{});
    auto hp = cg::net::parse_host_port(b.tcp_address);
    BOOST_REQUIRE(hp.has_value());
    std::vector<cg::net::tcp::endpoint> eps{{asio::ip::make_address(hp->host), hp->port}};
    bool ended = false;
    cg::error end;
    asio::co_spawn(ex, conn->run(eps), [&](std::exception_ptr ep, cg::error e) {
        if (ep) e = cg::error(cg::nsq::errc::bad_response, "run() threw");
        end = std::move(e);
        ended = true;
    });
    BOOST_REQUIRE_MESSAGE(co_await wait_for([&] { return conn->subscribed() || ended; }, seconds(5)), b.name);
    BOOST_REQUIRE_MESSAGE(conn->subscribed(), b.name << ": " << end.describe());
    conn->send_rdy(3);
    BOOST_REQUIRE_MESSAGE(co_await wait_for([&] { return owner.tickets.size() == 3; }, seconds(5)), b.name);
    BOOST_TEST(conn->can_answer(owner.tickets[0]), b.name);
    conn->send_rdy(3000);  // over max_rdy_count: nsqd answers E_INVALID (fatal) and closes
    BOOST_REQUIRE_MESSAGE(co_await wait_for([&] { return ended; }, seconds(5)), b.name);
    BOOST_TEST(end.message.find("E_INVALID RDY count 3000 out of range 0-2500") != std::string::npos,
               b.name << ": " << end.describe());
    BOOST_REQUIRE_MESSAGE(owner.tried, b.name);
    BOOST_TEST((owner.phase_then != cg::nsq::connection::phase::closed), b.name << ": not the window");
    BOOST_TEST(!owner.answerable, b.name);
    BOOST_TEST(!owner.fin, b.name << ": FIN accepted by a failed connection (never written)");
    BOOST_TEST(!owner.req, b.name << ": REQ accepted by a failed connection");
    BOOST_TEST(!owner.touch, b.name << ": TOUCH accepted by a failed connection");
    auto ch = co_await b.channel(topic, "c");
    BOOST_TEST(ch.in_flight == 3, b.name << ": nothing was answered, all three stay in flight");
}

// --- RDY counts the deliveries still in hand ------------------------------------------------------------

inline cg::nsq::consumer_config budget_config(const std::string& topic, std::vector<std::string> addresses) {
    cg::nsq::consumer_config c;
    c.topic = topic;
    c.channel = "c";
    c.nsqd_tcp_addresses = std::move(addresses);
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(10000);
    c.max_in_flight = 4;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(200);
    c.rdy_settle_delay = milliseconds(20);
    c.rdy_redistribute_interval = milliseconds(100);
    c.low_rdy_idle_timeout = milliseconds(200);
    c.drain_timeout = milliseconds(3000);
    return c;
}

// A consumer of `topic` on nsqds a and b (budget_config) whose handlers all wait at one gate, then record
// their message's body and FIN it.
struct gated_consumer {
    gated_consumer(asio::any_io_executor ex, const std::string& topic, const broker& a, const broker& b)
        : g(ex),
          c(
              ex, budget_config(topic, {a.tcp_address, b.tcp_address}),
              [this](cg::nsq::message& m) { return handle(m); }, {}, reg) {}
    asio::awaitable<cg::nsq::disposition> handle(cg::nsq::message& m) {
        co_await g.pass();
        handled.insert(m.body());
        co_return cg::nsq::disposition::finish();
    }
    gate g;
    std::multiset<std::string> handled;
    cg::metrics::registry reg;
    cg::nsq::consumer c;
};

// nsqd B comes up while A's connection holds max_in_flight deliveries whose handlers wait. A's RDY goes
// down to its share, but the deliveries already sent stay: B may only get RDY as they finish. Before,
// B got its share at once and nsqd sent messages no handler could take (they waited untouched, their
// msg_timeout running). The window in which nothing more may arrive spans the settle delay and the
// redistribute timer several times over (an absence cannot be awaited).
inline asio::awaitable<void> a_joining_nsqd_waits_for_deliveries_in_hand(broker a, broker b,
                                                                         std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    co_await a.create_channel(topic, "c");
    co_await a.publish(topic, bodies("a-", 6));
    gated_consumer run(ex, topic, a, b);
    auto& [g, handled, reg, c] = run;
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE(co_await wait_for([&] { return c.stats().received == 4; }, seconds(5)));
    co_await b.start();
    co_await b.create_channel(topic, "c");
    co_await b.publish(topic, bodies("b-", 6));
    BOOST_REQUIRE(co_await wait_for([&] { return c.subscribed_connections() == 2; }, seconds(5)));
    bool more = co_await wait_for([&] { return c.stats().received > 4; }, milliseconds(700));
    BOOST_TEST(!more, a.name << ": " << c.stats().received << " received while 4 handlers held theirs");
    g.release();
    BOOST_REQUIRE(co_await wait_for([&] { return handled.size() == 12; }, seconds(10)));
    BOOST_TEST(c.stats().max_outstanding <= 4u, a.name);
    BOOST_TEST(c.stats().max_handlers <= 4u, a.name);
    BOOST_TEST(c.stats().fin_failed == 0u, a.name);
    co_await c.stop();
    for (auto* br : {&a, &b}) {
        auto ch = co_await br->channel(topic, "c");
        BOOST_TEST(ch.depth == 0, br->name);
        BOOST_TEST(ch.in_flight == 0, br->name);
        BOOST_TEST(ch.timeout_count == 0u, br->name);
    }
}

// A's connection drops while its handlers run (their FINs are lost; nsqd redelivers those messages
// after msg_timeout). B is left alone, but A's deliveries still occupy their handlers: B keeps its share
// until they finish instead of taking max_in_flight at once.
inline asio::awaitable<void> a_dropped_nsqds_running_deliveries_keep_their_budget(broker a, broker b,
                                                                                  std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    co_await a.create_channel(topic, "c");
    co_await b.create_channel(topic, "c");
    gated_consumer run(ex, topic, a, b);
    auto& [g, handled, reg, c] = run;
    BOOST_REQUIRE(c.start().has_value());
    // Both subscribed with RDY 2 each (the first one had all 4 until the second came).
    BOOST_REQUIRE(co_await wait_for(
        [&] { return c.subscribed_connections() == 2 && c.stats().total_rdy == 4; }, seconds(5)));
    co_await a.publish(topic, bodies("a-", 6));
    BOOST_REQUIRE(co_await wait_for([&] { return c.stats().received == 2; }, seconds(5)));  // A's share
    co_await b.publish(topic, bodies("b-", 6));
    BOOST_REQUIRE(co_await wait_for([&] { return c.stats().received == 4; }, seconds(5)));  // B's share
    co_await a.drop();
    BOOST_REQUIRE(co_await wait_for([&] { return c.stats().disconnects >= 1; }, seconds(5)));
    bool more = co_await wait_for([&] { return c.stats().received > 4; }, milliseconds(700));
    BOOST_TEST(!more, a.name << ": " << c.stats().received << " received while 4 handlers held theirs");
    g.release();
    BOOST_REQUIRE(co_await wait_for(
        [&] {
            int from_b = 0;
            for (const auto& h : handled) from_b += h.rfind("b-", 0) == 0;
            return from_b == 6;
        },
        seconds(10)));
    BOOST_TEST(c.stats().max_outstanding <= 4u, a.name);
    BOOST_TEST(c.stats().responses_dropped >= 2u, a.name << ": the FINs of A's two");
    co_await c.stop();
    auto ch = co_await b.channel(topic, "c");
    BOOST_TEST(ch.depth == 0, b.name);
    BOOST_TEST(ch.timeout_count == 0u, b.name);
}

// --- the producer refuses what nsqd would refuse fatally -----------------------------------------------

// Publishes pipelined on one connection, some of which nsqd would answer with a fatal error (and close
// the connection under the others): each bad one fails alone, with invalid_publish, before anything is
// sent; every good one is published.
inline asio::awaitable<void> a_bad_publish_fails_alone(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    co_await b.create_channel(topic, "c");
    cg::nsq::producer_config pc;
    pc.heartbeat_interval = milliseconds(1000);
    cg::nsq::producer prod(ex, b.tcp_address, pc, {});
    struct call {
        std::string what;
        bool valid = true;
        bool done = false;
        cg::error err;
    };
    std::vector<std::unique_ptr<call>> calls;
    auto spawn = [&](std::string what, bool valid, asio::awaitable<cg::result<void>> op) {
        calls.push_back(std::make_unique<call>());
        auto* c = calls.back().get();
        c->what = std::move(what);
        c->valid = valid;
        asio::co_spawn(ex, std::move(op), [c](std::exception_ptr ep, cg::result<void> r) {
            if (ep) r = cg::error(cg::nsq::errc::bad_response, "threw");
            if (!r) c->err = r.err();
            c->done = true;
        });
    };
    const std::string too_big(static_cast<std::size_t>(pc.max_msg_size) + 1, 'x');
    std::vector<std::string> mpub_empty = {"m-0", "", "m-2"};
    std::vector<std::string> mpub_huge(6, std::string(1024 * 1024 - 16, 'y'));  // 6 MiB > max_body_size
    spawn("PUB 0", true, prod.publish(topic, "ok-0"));
    spawn("PUB empty", false, prod.publish(topic, ""));
    spawn("PUB 1", true, prod.publish(topic, "ok-1"));
    spawn("MPUB with an empty element", false, prod.multi_publish(topic, mpub_empty));
    spawn("PUB 2", true, prod.publish(topic, "ok-2"));
    spawn("DPUB over max-req-timeout", false,
          prod.deferred_publish(topic, pc.max_req_timeout + milliseconds(1), "later"));
    spawn("PUB 3", true, prod.publish(topic, "ok-3"));
    spawn("PUB over max-msg-size", false, prod.publish(topic, too_big));
    spawn("MPUB over max-body-size", false, prod.multi_publish(topic, mpub_huge));
    spawn("DPUB at max-req-timeout", true, prod.deferred_publish(topic, pc.max_req_timeout, "latest"));
    std::vector<std::string> ok_batch = {"ok-4", "ok-5"};
    spawn("MPUB 4-5", true, prod.multi_publish(topic, ok_batch));
    BOOST_REQUIRE(co_await wait_for(
        [&] {
            for (auto& c : calls)
                if (!c->done) return false;
            return true;
        },
        seconds(10)));
    for (auto& c : calls) {
        if (c->valid) {
            BOOST_TEST(!c->err, b.name << ": " << c->what << ": " << c->err.describe());
        } else {
            BOOST_TEST((c->err.code == cg::nsq::errc::invalid_publish),
                       b.name << ": " << c->what << ": " << c->err.describe());
        }
    }
    BOOST_TEST(prod.published_messages() == 7u, b.name);
    auto ch = co_await b.channel(topic, "c");
    BOOST_TEST(ch.depth == 6, b.name);
    BOOST_TEST(ch.deferred == 1, b.name);
    BOOST_TEST((co_await prod.publish(topic, "after")).has_value(), b.name);
    co_await prod.close();
}

// --- heartbeats during the handshake --------------------------------------------------------------------

// AUTH waits for nsqd's round trip to its auth server (here slower than the heartbeat interval): a
// `_heartbeat_` arrives before the AUTH reply. Consumer and producer answer it and authenticate.
inline asio::awaitable<void> auth_outlasting_a_heartbeat_succeeds(broker b, std::string topic,
                                                                  std::string secret) {
    auto ex = co_await asio::this_coro::executor;
    cg::nsq::nsq_security sec;
    sec.auth_secret = secret;
    cg::nsq::producer_config pc;
    pc.heartbeat_interval = milliseconds(1000);
    pc.connect_timeout = milliseconds(5000);
    pc.security = sec;
    cg::nsq::producer prod(ex, b.tcp_address, pc, {});
    auto r = co_await prod.multi_publish(topic, bodies("auth-", 3));
    BOOST_REQUIRE_MESSAGE(r.has_value(), b.name << ": publish: " << (r ? "" : r.err().describe()));
    co_await prod.close();
    auto cfg = budget_config(topic, {b.tcp_address});
    cfg.connect_timeout = milliseconds(5000);
    cfg.security = sec;
    std::set<std::string> got;
    cg::metrics::registry reg;
    cg::nsq::consumer c(
        ex, cfg,
        [&](cg::nsq::message& m) -> asio::awaitable<cg::nsq::disposition> {
            got.insert(m.body());
            co_return cg::nsq::disposition::finish();
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE_MESSAGE(co_await wait_for([&] { return got.size() == 3; }, seconds(10)), b.name);
    BOOST_TEST(c.stats().connects == 1u, b.name);
    BOOST_TEST(c.stats().disconnects == 0u, b.name);
    co_await c.stop();
}

}  // namespace nsqscenario
