// The consumer against real nsqd 1.3.0, and the differential check: each scenario fake-nsqd also supports
// runs against both, and the observable trace (attempts, FIN/REQ/TOUCH outcomes, nsqd's own counters,
// error frames) must be the same. Where they differ, fake-nsqd is wrong.// Here the differential scenarios;
// nsqd's refusals of bad IDENTIFY bounds and msg_timeout are conformance_refusals_test.cpp, the shared nsqd
// conformance.hpp.
#include "conformance.hpp"

#include <boost/test/unit_test.hpp>
#include <functional>
#include <map>
#include <ostream>
#include <set>

namespace {

// What a scenario lets a client and an operator observe.
struct trace {
    std::vector<int> attempts;  // per handler call, in order
    std::uint64_t fin_failed = 0, req_failed = 0, touch_failed = 0, finished = 0, requeued = 0;
    bool touched = false;
    std::uint64_t timeout_count = 0, requeue_count = 0;
    std::int64_t deferred_count = 0, depth = 0, in_flight = 0;
    std::uint64_t connects = 0, disconnects = 0;
};

std::ostream& operator<<(std::ostream& o, const trace& t) {
    o << "attempts=[";
    for (auto a : t.attempts) o << a << ' ';
    return o << "] fin_failed=" << t.fin_failed << " req_failed=" << t.req_failed
             << " touch_failed=" << t.touch_failed << " finished=" << t.finished << " requeued=" << t.requeued
             << " touched=" << t.touched << " timeout_count=" << t.timeout_count
             << " requeue_count=" << t.requeue_count << " deferred=" << t.deferred_count
             << " depth=" << t.depth << " in_flight=" << t.in_flight << " connects=" << t.connects
             << " disconnects=" << t.disconnects;
}

bool same(const trace& a, const trace& b) {
    return a.attempts == b.attempts && a.fin_failed == b.fin_failed && a.req_failed == b.req_failed &&
           a.touch_failed == b.touch_failed && a.finished == b.finished && a.requeued == b.requeued &&
           a.touched == b.touched && a.timeout_count == b.timeout_count &&
           a.requeue_count == b.requeue_count && a.deferred_count == b.deferred_count && a.depth == b.depth &&
           a.in_flight == b.in_flight && a.connects == b.connects && a.disconnects == b.disconnects;
}

void take_consumer(trace& t, const consumer& c) {
    const auto& s = c.stats();
    t.fin_failed = s.fin_failed;
    t.req_failed = s.req_failed;
    t.touch_failed = s.touch_failed;
    t.finished = s.finished;
    t.requeued = s.requeued;
    t.touched = s.touches > 0;
    t.connects = s.connects;
    t.disconnects = s.disconnects;
}

asio::awaitable<void> take_channel(trace& t, broker& b, const std::string& topic) {
    auto ch = co_await b.http.stats(topic, "c");
    t.timeout_count = ch.timeout_count;
    t.requeue_count = ch.requeue_count;
    t.deferred_count = ch.deferred_count;
    t.depth = ch.depth;
    t.in_flight = ch.in_flight_count;
}

// Handler 1.5 × msg_timeout without keepalive: nsqd times the message out and redelivers it (attempt 2)
// to the same client while handler 1 still runs. Handler 1's FIN then finishes the redelivery (nsqd
// finishes by id), and attempt 2's FIN comes back E_FIN_FAILED — counted, no crash, no reconnect.
asio::awaitable<trace> late_fin(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::string> one = {"late-1"};
    co_await b.http.mpub(topic, one);
    trace t;
    cg::metrics::registry reg;
    consumer c(
        ex, config_for(b, topic),
        [&](message& m) -> asio::awaitable<disposition> {
            t.attempts.push_back(m.attempts());
            if (m.attempts() == 1) co_await cg::net::sleep_for(milliseconds(1500));
            co_return disposition::finish();
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE_MESSAGE(co_await eventually([&] { return c.stats().fin_failed >= 1; }, seconds(8)), b.name);
    co_await cg::net::sleep_for(milliseconds(300));  // anything else nsqd would still send arrives now
    co_await c.stop();
    take_consumer(t, c);
    co_await take_channel(t, b, topic);
    co_return t;
}

// Handler 3 × msg_timeout holding a keepalive, heartbeats every second: nsqd never times it out and the
// connection stays up while the handler is busy.
asio::awaitable<trace> keepalive_3x(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::string> one = {"keep-1"};
    co_await b.http.mpub(topic, one);
    trace t;
    std::size_t touches = 0;
    cg::metrics::registry reg;
    consumer c(
        ex, config_for(b, topic),
        [&](message& m) -> asio::awaitable<disposition> {
            t.attempts.push_back(m.attempts());
            cg::nsq::keepalive ka(m);
            co_await cg::net::sleep_for(milliseconds(3000));
            touches = ka.touches();
            co_return disposition::finish();
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE_MESSAGE(co_await eventually([&] { return c.stats().finished == 1; }, seconds(8)), b.name);
    co_await cg::net::sleep_for(milliseconds(300));
    BOOST_TEST(touches >= 4u, b.name << ": " << touches << " touches");
    co_await c.stop();
    take_consumer(t, c);
    co_await take_channel(t, b, topic);
    co_return t;
}

// REQ with a delay: the message waits in nsqd's deferred queue (deferred_count 1, requeue_count 1).
asio::awaitable<trace> req_with_delay(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::string> one = {"defer-1"};
    co_await b.http.mpub(topic, one);
    trace t;
    cg::metrics::registry reg;
    consumer c(
        ex, config_for(b, topic),
        [&](message& m) -> asio::awaitable<disposition> {
            t.attempts.push_back(m.attempts());
            co_return disposition::requeue_without_backoff(seconds(30));
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE_MESSAGE(co_await eventually([&] { return c.stats().requeued == 1; }, seconds(5)), b.name);
    channel_stats ch;
    auto end = steady_clock::now() + seconds(5);
    do {
        ch = co_await b.http.stats(topic, "c");
    } while (ch.deferred_count != 1 && steady_clock::now() < end);
    co_await c.stop();
    take_consumer(t, c);
    co_await take_channel(t, b, topic);
    co_return t;
}

// CLS with messages in flight: stop() sends RDY 0, waits for the running handlers, their FINs are
// accepted after CLS (nsqd still takes FIN while closing), nothing times out, the rest stays queued.
asio::awaitable<trace> cls_drain(broker b, std::string topic) {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::string> bodies;
    for (int i = 0; i < 20; ++i) bodies.push_back("drain-" + std::to_string(i));
    co_await b.http.mpub(topic, bodies);
    trace t;
    cg::metrics::registry reg;
    auto cfg = config_for(b, topic);
    cfg.max_in_flight = 5;
    cfg.msg_timeout = milliseconds(5000);
    int running = 0;
    consumer c(
        ex, cfg,
        [&](message& m) -> asio::awaitable<disposition> {
            t.attempts.push_back(m.attempts());
            ++running;
            co_await cg::net::sleep_for(milliseconds(400));
            co_return disposition::finish();
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE_MESSAGE(co_await eventually([&] { return running == 5; }, seconds(5)), b.name);
    co_await c.stop();  // 5 handlers are mid-way
    take_consumer(t, c);
    co_await take_channel(t, b, topic);
    co_return t;
}

template <typename Scenario>
void differential(const std::string& topic_prefix, Scenario scenario, bool needs_scan,
                  std::function<void(const trace&)> check) {
    trace real_t, fake_t;
    cg::test::run_async(
        [&]() -> asio::awaitable<void> {
            if (needs_scan) co_await await_scanned();
            broker real{"nsqd", shared().nsqd->tcp_address(), shared().nsqd->http()};
            real_t = co_await scenario(real, topic_prefix);
        },
        seconds(40));
    cg::test::run_async(
        [&]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            fake_nsqd_options o;
            o.queue_scan_interval = milliseconds(100);  // nsqd's --queue-scan-interval
            fake_nsqd fake(ex, o);
            BOOST_REQUIRE(fake.start().has_value());
            broker fb{"fake-nsqd", fake.tcp_address(), nsqd_http{fake.http_port()}};
            co_await fb.http.create_channel(topic_prefix, "c");
            fake_t = co_await scenario(fb, topic_prefix);
            fake.stop();
        },
        seconds(40));
    BOOST_TEST_MESSAGE("nsqd:      " << real_t);
    BOOST_TEST_MESSAGE("fake-nsqd: " << fake_t);
    check(real_t);
    BOOST_TEST(same(real_t, fake_t), "trace differs\n  nsqd:      " << real_t << "\n  fake-nsqd: " << fake_t);
}

}  // namespace

BOOST_AUTO_TEST_CASE(late_fin_is_counted_as_fin_failed_same_trace_as_fake) {
    differential("late", late_fin, true, [](const trace& t) {
        BOOST_TEST((t.attempts == std::vector<int>{1, 2}));
        BOOST_TEST(t.fin_failed == 1u);
        BOOST_TEST(t.timeout_count == 1u);
        BOOST_TEST(t.depth == 0);
        BOOST_TEST(t.in_flight == 0);
        BOOST_TEST(t.disconnects == 1u);  // only the stop() at the end
    });
}

BOOST_AUTO_TEST_CASE(keepalive_and_heartbeats_hold_a_handler_three_msg_timeouts_long) {
    differential("keep", keepalive_3x, true, [](const trace& t) {
        BOOST_TEST((t.attempts == std::vector<int>{1}));
        BOOST_TEST(t.timeout_count == 0u);  // nsqd's own count
        BOOST_TEST(t.fin_failed == 0u);
        BOOST_TEST(t.touched);
        BOOST_TEST(t.connects == 1u);  // heartbeats answered while the handler was busy
    });
}

BOOST_AUTO_TEST_CASE(req_with_delay_lands_in_nsqds_deferred_queue) {
    differential("defer", req_with_delay, false, [](const trace& t) {
        BOOST_TEST((t.attempts == std::vector<int>{1}));
        BOOST_TEST(t.deferred_count == 1);
        BOOST_TEST(t.requeue_count == 1u);
        BOOST_TEST(t.depth == 0);
        BOOST_TEST(t.in_flight == 0);
    });
}

BOOST_AUTO_TEST_CASE(cls_drain_finishes_in_flight_messages_after_close_wait) {
    differential("drain", cls_drain, false, [](const trace& t) {
        BOOST_TEST(t.attempts.size() == 5u);
        BOOST_TEST(t.finished == 5u);
        BOOST_TEST(t.fin_failed == 0u);
        BOOST_TEST(t.in_flight == 0);
        BOOST_TEST(t.depth == 15);
        BOOST_TEST(t.timeout_count == 0u);
    });
}

BOOST_AUTO_TEST_CASE(pause_and_unpause_with_messages_in_flight) {
    auto scenario = [](broker b, std::string topic) -> asio::awaitable<trace> {
        auto ex = co_await asio::this_coro::executor;
        std::vector<std::string> bodies;
        for (int i = 0; i < 10; ++i) bodies.push_back("p-" + std::to_string(i));
        co_await b.http.mpub(topic, bodies);
        trace t;
        cg::metrics::registry reg;
        auto cfg = config_for(b, topic);
        cfg.max_in_flight = 4;
        cfg.msg_timeout = milliseconds(5000);
        bool release = false;
        std::map<std::string, int> seen;
        consumer c(
            ex, cfg,
            [&](message& m) -> asio::awaitable<disposition> {
                t.attempts.push_back(m.attempts());
                ++seen[m.body()];
                while (!release) co_await cg::net::sleep_for(milliseconds(5));
                co_return disposition::finish();
            },
            {}, reg);
        BOOST_REQUIRE(c.start().has_value());
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().received == 4; }, seconds(5)));
        co_await b.http.pause_channel(topic, "c", true);
        release = true;  // the 4 in flight finish while paused: their FINs are accepted
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().finished == 4; }, seconds(5)));
        co_await cg::net::sleep_for(milliseconds(400));
        auto paused = co_await b.http.stats(topic, "c");
        BOOST_TEST(paused.paused, b.name);
        BOOST_TEST(c.stats().received == 4u, b.name << ": nothing delivered while paused");
        BOOST_TEST(paused.in_flight_count == 0, b.name);
        BOOST_TEST(paused.depth == 6, b.name);
        co_await b.http.pause_channel(topic, "c", false);
        BOOST_REQUIRE(co_await eventually([&] { return c.stats().finished == 10; }, seconds(5)));
        for (const auto& [body, n] : seen) BOOST_TEST(n == 1, body);
        co_await c.stop();
        take_consumer(t, c);
        co_await take_channel(t, b, topic);
        co_return t;
    };
    differential("pause", scenario, false, [](const trace& t) {
        BOOST_TEST(t.finished == 10u);
        BOOST_TEST(t.fin_failed == 0u);
        BOOST_TEST(t.depth == 0);
    });
}
