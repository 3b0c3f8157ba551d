// The consumer against real nsqd 1.3.0, and the differential check: each scenario fake-nsqd also supports
// runs against both, and the observable trace (attempts, FIN/REQ/TOUCH outcomes, nsqd's own counters,
// error frames) must be the same. Where they differ, fake-nsqd is wrong.
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "fake_nsqd.hpp"
#include "harness.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/identify.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;
using cg::test::nsq::fake_nsqd;
using cg::test::nsq::fake_nsqd_options;

namespace {

// Topics the shared nsqd knows from its start, with channel "c" created, so nsqd's queue scan (which
// picks up new channels only every 5 s) already watches them when a test needs message timeouts.
const std::vector<std::string> shared_topics = {"late", "keep", "defer", "drain", "pause", "rdycap"};

struct shared_nsqd {
    std::unique_ptr<real_nsqd> nsqd;
    steady_clock::time_point channels_created{};
};

shared_nsqd& shared() {
    static shared_nsqd s;
    if (!s.nsqd) {
        s.nsqd = std::make_unique<real_nsqd>();
        cg::test::run_async([&]() -> asio::awaitable<void> {
            co_await s.nsqd->start();
            auto h = s.nsqd->http();
            for (const auto& t : shared_topics) co_await h.create_channel(t, "c");
        });
        s.channels_created = steady_clock::now();
    }
    return s;
}

// Waits (on a timer) until nsqd's queue scan has seen the shared channels.
asio::awaitable<void> await_scanned() {
    auto left = shared().channels_created + queue_scan_refresh - steady_clock::now();
    if (left > steady_clock::duration::zero()) co_await cg::net::sleep_for(left);
}

struct broker {
    std::string name;
    std::string tcp;
    nsqd_http http;
};

consumer_config config_for(const broker& b, const std::string& topic) {
    consumer_config c;
    c.topic = topic;
    c.channel = "c";
    c.nsqd_tcp_addresses = {b.tcp};
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(1000);
    c.max_in_flight = 1;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(400);
    c.drain_timeout = milliseconds(5000);
    return c;
}

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

BOOST_AUTO_TEST_CASE(identify_bounds_are_refused_with_nsqds_own_errors_byte_for_byte) {
    // Raw exchanges: every reply from real nsqd and fake-nsqd must be the same bytes.
    auto exchange = [](std::uint16_t port, std::string identify_json,
                       bool rdy_over) -> asio::awaitable<std::string> {
        cg::net::tcp_socket s(co_await asio::this_coro::executor);
        auto [cec] = co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port});
        if (cec) throw std::runtime_error("connect");
        std::string out;
        cg::nsq::proto::append_magic(out);
        cg::nsq::proto::append_identify(out, identify_json);
        if (rdy_over) {
            cg::nsq::proto::append_sub(out, "bounds", "c");
            cg::nsq::proto::append_rdy(out, 3000);
        }
        co_await asio::async_write(s, asio::buffer(out), cg::net::nothrow);
        std::string got = co_await nsqreal::read_until_close(s);  // every case here is fatal
        // The IDENTIFY reply in the RDY case differs in nothing but is long: keep only error frames.
        auto pos = got.find("E_");
        co_return pos == std::string::npos ? got : got.substr(pos - 8);
    };
    const std::vector<std::pair<std::string, bool>> cases = {
        {R"({"feature_negotiation":true,"msg_timeout":1000000})", false},
        {R"({"feature_negotiation":true,"msg_timeout":999})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":999})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":60001})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":1000})", true},
    };
    cg::test::run_async([&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd fake(ex);
        BOOST_REQUIRE(fake.start().has_value());
        for (const auto& [json, rdy] : cases) {
            auto real_bytes = co_await exchange(shared().nsqd->tcp_port(), json, rdy);
            auto fake_bytes = co_await exchange(fake.tcp_port(), json, rdy);
            BOOST_TEST(real_bytes.find("E_") != std::string::npos, json << " → " << real_bytes);
            BOOST_TEST(real_bytes == fake_bytes,
                       json << "\n  nsqd:      " << real_bytes << "\n  fake-nsqd: " << fake_bytes);
        }
        fake.stop();
    });
}

BOOST_AUTO_TEST_CASE(consumer_reports_nsqds_refusal_of_msg_timeout_and_respects_max_rdy_count) {
    cg::test::run_async(
        [&]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            nsqd_options no;
            no.extra = {"--max-msg-timeout=10s", "--max-rdy-count=3"};
            real_nsqd nsqd(no);
            co_await nsqd.start();
            fake_nsqd_options fo;
            fo.max_msg_timeout = seconds(10);
            fo.max_rdy_count = 3;
            fake_nsqd fake(ex, fo);
            BOOST_REQUIRE(fake.start().has_value());
            for (broker b : {broker{"nsqd", nsqd.tcp_address(), nsqd.http()},
                             broker{"fake-nsqd", fake.tcp_address(), nsqd_http{fake.http_port()}}}) {
                // 20 s is within what chargeguard accepts (≤ 15 min) but over this nsqd's --max-msg-timeout.
                {
                    auto sink = std::make_shared<cg::memory_sink>();
                    cg::metrics::registry reg;
                    auto cfg = config_for(b, "cap");
                    cfg.msg_timeout = seconds(20);
                    consumer c(
                        ex, cfg,
                        [](message&) -> asio::awaitable<disposition> { co_return disposition::finish(); },
                        cg::logger(sink, cg::log_level::info), reg);
                    BOOST_REQUIRE(c.start().has_value());
                    BOOST_TEST(
                        co_await eventually(
                            [&] {
                                return sink->contains("E_BAD_BODY IDENTIFY msg timeout (20000) is invalid");
                            },
                            seconds(5)),
                        b.name);
                    BOOST_TEST(c.stats().connects == 0u);
                    co_await c.stop();
                }
                // max_in_flight 10 against max_rdy_count 3: RDY never above 3 (E_INVALID would end the
                // connection).
                std::vector<std::string> bodies;
                for (int i = 0; i < 40; ++i) bodies.push_back("cap-" + std::to_string(i));
                co_await b.http.mpub("rdycap", bodies);
                cg::metrics::registry reg;
                auto cfg = config_for(b, "rdycap");
                cfg.max_in_flight = 10;
                std::set<std::string> seen;
                consumer c(
                    ex, cfg,
                    [&](message& m) -> asio::awaitable<disposition> {
                        seen.insert(m.body());
                        co_await cg::net::sleep_for(milliseconds(5));
                        co_return disposition::finish();
                    },
                    {}, reg);
                BOOST_REQUIRE(c.start().has_value());
                std::int64_t peak = 0;
                auto end = steady_clock::now() + seconds(10);
                while (seen.size() < 40 && steady_clock::now() < end) {
                    auto ch = co_await b.http.stats("rdycap", "c");
                    peak = std::max(peak, ch.ready_sum());
                }
                BOOST_TEST(seen.size() == 40u, b.name);
                BOOST_TEST(peak <= 3, b.name << " peak RDY " << peak);
                BOOST_TEST(peak >= 1, b.name);
                BOOST_TEST(c.stats().disconnects == 0u, b.name);
                co_await c.stop();
            }
            fake.stop();
        },
        seconds(60));
}

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
