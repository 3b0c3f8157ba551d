// The health server of the runtime, over real sockets: /healthz, /readyz, /metrics, a deliberately
// blocked loop turning /healthz red, and malformed requests that must not take the server down.
#include <algorithm>
#include <asio/post.hpp>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "app/cli.hpp"
#include "app/runtime.hpp"
#include "support/prom_text.hpp"
#include "support/raw_http.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

struct running_runtime {
    std::shared_ptr<memory_sink> sink = std::make_shared<memory_sink>();
    app::runtime rt;
    std::atomic<bool> db_ready{false};
    unsigned short port = 0;
    std::thread loop;

    explicit running_runtime(app::runtime_options o, std::string host = "127.0.0.1",
                             std::function<void(app::runtime&)> before_start = {})
        : rt(with_defaults(o, host), logger(sink, log_level::debug)) {
        rt.health().add_readiness("database", [this] {
            return metrics::check_status{db_ready.load(), db_ready
                                                              ? "answering host=db.internal port=5432"
                                                              : "unreachable host=db.internal port=5432"};
        });
        if (before_start) before_start(rt);
        auto ep = rt.start();
        BOOST_REQUIRE_MESSAGE(ep.has_value(), (ep ? "" : ep.err().describe()));
        port = ep->port();
        loop = std::thread([this] { rt.run(); });
    }
    ~running_runtime() {
        asio::post(rt.io(), [this] { rt.request_stop("test over"); });
        loop.join();
    }
    static app::runtime_options with_defaults(app::runtime_options o, const std::string& host) {
        o.health_listen = {host, 0};
        o.handle_signals = false;
        return o;
    }
};

// For the tests that are not about loop lag: a loaded (ASan, parallel) machine must not turn them red.
app::runtime_options lenient() {
    app::runtime_options o;
    o.max_loop_lag = 2s;
    return o;
}

int healthz_once_green(unsigned short port) {
    int status = 0;
    auto until = std::chrono::steady_clock::now() + 5s;
    while (status != 200 && std::chrono::steady_clock::now() < until)
        status = test::http_get(port, "/healthz").status;
    return status;
}

double lag_over(const test::prom_family& f, const std::string& lo) {
    return test::bucket_count(f, "+Inf") - test::bucket_count(f, lo);
}

}  // namespace

BOOST_AUTO_TEST_CASE(healthz_readyz_metrics) {
    running_runtime r(lenient());
    auto h = test::http_get(r.port, "/healthz");
    BOOST_TEST(h.status == 200);
    BOOST_TEST(h.body.find("ok event_loop") != std::string::npos);

    auto not_ready = test::http_get(r.port, "/readyz");
    BOOST_TEST(not_ready.status == 503);
    BOOST_TEST(not_ready.body == "FAIL database: unreachable host=db.internal port=5432\n");
    r.db_ready = true;
    auto ready = test::http_get(r.port, "/readyz");
    BOOST_TEST(ready.status == 200);

    auto m = test::http_get(r.port, "/metrics");
    BOOST_TEST(m.status == 200);
    BOOST_TEST(*m.headers.get("Content-Type") == "text/plain; version=0.0.4; charset=utf-8");
    auto fams = test::parse_prometheus(m.body);
    BOOST_REQUIRE(fams.count("chargeguard_event_loop_lag_seconds"));
    BOOST_TEST(fams["chargeguard_event_loop_lag_seconds"].type == "histogram");

    BOOST_TEST(test::http_get(r.port, "/nope").status == 404);
    test::raw_http c(r.port);
    BOOST_TEST(c.exchange("POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status == 405);
}

BOOST_AUTO_TEST_CASE(keep_alive_serves_many_requests_on_one_connection) {
    running_runtime r(lenient());
    test::raw_http c(r.port);
    for (int i = 0; i < 20; ++i) BOOST_TEST(c.get("/healthz").status == 200);
    // Two pipelined requests in one write: both answered, in order.
    c.exchange("GET /healthz HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n");
    BOOST_TEST(c.read_response().status == 404);
}

BOOST_AUTO_TEST_CASE(blocked_loop_turns_healthz_red_and_is_recorded) {
    app::runtime_options o;
    o.max_loop_lag = 100ms;
    o.lag_window = 1s;
    o.lag_interval = 20ms;
    running_runtime r(o);
    BOOST_TEST(healthz_once_green(r.port) == 200);  // start-up lag, if any, has left the 1 s window

    // Block the main loop for 300 ms on purpose, and ask /healthz while it is blocked.
    std::promise<void> blocking;
    asio::post(r.rt.io(), [&blocking] {
        blocking.set_value();
        std::this_thread::sleep_for(300ms);
    });
    blocking.get_future().wait();
    auto h = test::http_get(r.port, "/healthz");  // answered once the loop is free again
    BOOST_TEST(h.status == 503);
    BOOST_TEST(h.body.find("FAIL event_loop") != std::string::npos);

    // The lag histogram records a sample between 0.25 s and 0.5 s once the late tick has run.
    double late = 0;
    for (int i = 0; i < 100 && late < 1; ++i) {
        auto fams = test::parse_prometheus(test::http_get(r.port, "/metrics").body);
        auto& f = fams.at("chargeguard_event_loop_lag_seconds");
        late = lag_over(f, "0.25");
        BOOST_TEST(lag_over(f, "0.5") == 0);
    }
    BOOST_TEST(late >= 1);

    // Liveness recovers once the window has passed without lag.
    BOOST_TEST(healthz_once_green(r.port) == 200);
}

BOOST_AUTO_TEST_CASE(loop_lag_interval_flag_sets_the_probe_and_the_probe_samples_at_it) {
    auto parse = [](std::vector<std::string> args) {
        CLI::App cmd;
        app::runtime_flags f;
        app::add_runtime_flags(cmd, f);
        std::reverse(args.begin(), args.end());  // CLI11 takes them last first
        cmd.parse(args);
        return app::to_runtime_options(f);
    };
    BOOST_TEST(parse({}).lag_interval == std::chrono::steady_clock::duration(50ms));
    auto o = parse({"--loop-lag-interval", "0.005"});
    BOOST_TEST(o.lag_interval == std::chrono::steady_clock::duration(5ms));
    BOOST_CHECK_THROW(parse({"--loop-lag-interval", "0"}), CLI::ValidationError);

    // The runtime takes it: at 5 ms the probe samples ~60 times in 300 ms (at the default 50 ms: 6).
    auto l = lenient();
    l.lag_interval = o.lag_interval;
    running_runtime r(l);
    auto samples = [&] {
        auto fams = test::parse_prometheus(test::http_get(r.port, "/metrics").body);
        return test::bucket_count(fams["chargeguard_event_loop_lag_seconds"], "+Inf");
    };
    auto before = samples();
    std::this_thread::sleep_for(300ms);  // what is counted is the passage of time itself
    auto taken = samples() - before;
    BOOST_TEST_MESSAGE("lag samples in ~300 ms at 5 ms: " << taken);
    BOOST_TEST(taken >= 20.0);
}

BOOST_AUTO_TEST_CASE(malformed_requests_get_4xx_and_server_keeps_serving) {
    running_runtime r(lenient());
    {
        test::raw_http c(r.port);
        auto resp = c.exchange("\x16\x03\x01\x02\x00 garbage\r\n\r\n");
        BOOST_TEST(resp.status == 400);
        BOOST_TEST(*resp.headers.get("Connection") == "close");
        BOOST_TEST(c.closed_by_peer());
    }
    {
        test::raw_http c(r.port);
        auto resp = c.exchange("GET /healthz HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'a') + "\r\n\r\n");
        BOOST_TEST(resp.status == 431);
    }
    {
        test::raw_http c(r.port);
        auto resp = c.exchange("POST /healthz HTTP/1.1\r\nContent-Length: 104857600\r\n\r\n");
        BOOST_TEST(resp.status == 413);
        BOOST_TEST(c.closed_by_peer());
    }
    {
        test::raw_http c(r.port);
        auto resp = c.exchange("POST /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        BOOST_TEST(resp.status == 400);
    }
    BOOST_TEST(test::http_get(r.port, "/healthz").status == 200);
    BOOST_TEST(r.sink->contains("health server listening"));
}

BOOST_AUTO_TEST_CASE(a_shutdown_step_that_throws_is_logged_and_fails_the_exit_code) {
    auto sink = std::make_shared<memory_sink>();
    app::runtime_options o;
    o.health_listen = {"127.0.0.1", 0};
    o.handle_signals = false;
    app::runtime rt(o, logger(sink, log_level::debug));
    bool other_ran = false;
    rt.on_shutdown([]() -> asio::awaitable<void> {
        throw std::runtime_error("drain bug");
        co_return;
    });
    rt.on_shutdown([&other_ran]() -> asio::awaitable<void> {
        other_ran = true;
        co_return;
    });
    BOOST_REQUIRE(rt.start().has_value());
    asio::post(rt.io(), [&rt] { rt.request_stop("test over"); });
    BOOST_TEST(rt.run() == 1);
    BOOST_TEST(other_ran);
    BOOST_TEST(sink->contains("shutdown step failed"));
    BOOST_TEST(sink->contains("drain bug"));
    BOOST_TEST(sink->contains("\"clean\":false"));
}

// On a listener reachable beyond this host, /readyz names the failing dependency and shows only what a check
// declares public: no host, port or user.
BOOST_AUTO_TEST_CASE(readyz_is_redacted_off_loopback) {
    running_runtime r(lenient(), "0.0.0.0", [](app::runtime& rt) {
        rt.health().add_readiness("schema", [] {
            return metrics::check_status{false, "database schema 0009 at db.internal",
                                         "database schema 0009"};
        });
    });
    auto not_ready = test::http_get(r.port, "/readyz");
    BOOST_TEST(not_ready.status == 503);
    BOOST_TEST(not_ready.body == "FAIL database\nFAIL schema: database schema 0009\n");
    BOOST_TEST(not_ready.body.find("db.internal") == std::string::npos);
    BOOST_TEST(r.sink->contains("\"redacted\":true"));
}

// /startupz: 503 while a startup condition has not held, 200 once it has, and 200 for good after that,
// whatever the dependency does; /healthz is not tied to it.
BOOST_AUTO_TEST_CASE(startupz_waits_then_latches) {
    auto up = std::make_shared<std::atomic<bool>>(false);
    running_runtime r(lenient(), "127.0.0.1", [up](app::runtime& rt) {
        rt.startup().require("dependency", "the dependency (first connection)", [up] { return up->load(); });
        rt.startup().require("marked", "a step that marks itself done");
    });
    auto waiting = test::http_get(r.port, "/startupz");
    BOOST_TEST(waiting.status == 503);
    BOOST_TEST(
        waiting.body ==
        "WAIT dependency: the dependency (first connection)\nWAIT marked: a step that marks itself done\n");
    BOOST_TEST(test::http_get(r.port, "/healthz").status == 200);
    *up = true;
    auto half = test::http_get(r.port, "/startupz");
    BOOST_TEST(half.status == 503);
    BOOST_TEST(half.body == "ok dependency\nWAIT marked: a step that marks itself done\n");
    std::promise<void> marked;
    asio::post(r.rt.io(), [&] {
        r.rt.startup().mark("marked");
        marked.set_value();
    });
    marked.get_future().wait();
    BOOST_TEST(test::http_get(r.port, "/startupz").status == 200);
    *up = false;  // a blip after startup does not matter here
    auto after = test::http_get(r.port, "/startupz");
    BOOST_TEST(after.status == 200);
    BOOST_TEST(after.body == "ok started\n");
}

// chargeguard_build_info and the process_* families, read from /proc/self on each scrape.
BOOST_AUTO_TEST_CASE(build_info_and_process_metrics) {
    running_runtime r(lenient());
    auto fams = test::parse_prometheus(test::http_get(r.port, "/metrics").body);
    BOOST_TEST_REQUIRE(fams.count("chargeguard_build_info"));
    const auto& bi = fams["chargeguard_build_info"].samples.at(0);
    BOOST_TEST(bi.value == 1);
    BOOST_TEST(bi.labels.at("version") == CHARGEGUARD_TEST_VERSION);
    BOOST_TEST(!bi.labels.at("revision").empty());
    BOOST_TEST(!bi.labels.at("build_type").empty());
    for (const char* f : {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                          "process_max_fds", "process_start_time_seconds"})
        BOOST_TEST_REQUIRE(fams.count(f), f);
    BOOST_TEST(fams["process_cpu_seconds_total"].type == "counter");
    BOOST_TEST(fams["process_resident_memory_bytes"].samples.at(0).value > 1e6);
    double fds = fams["process_open_fds"].samples.at(0).value;
    BOOST_TEST(fds >= 4);  // stdio, the listener, the epoll descriptor at least
    BOOST_TEST(fams["process_max_fds"].samples.at(0).value >= fds);
    double start = fams["process_start_time_seconds"].samples.at(0).value;
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    BOOST_TEST((start <= now + 1 && start > now - 3600));
    // Opening descriptors shows on the next scrape: the value is read at scrape time.
    std::vector<std::unique_ptr<test::raw_http>> held;
    for (int i = 0; i < 20; ++i) held.push_back(std::make_unique<test::raw_http>(r.port));
    auto again = test::parse_prometheus(test::http_get(r.port, "/metrics").body);
    BOOST_TEST(again["process_open_fds"].samples.at(0).value >= fds + 20);
}

// ~runtime destroys what is still queued on the main loop and on the offload pool while both exist. Here a
// handler queued on the main loop holds work on the pool, as a co_spawn hand-back from the pool does when
// the process stops before the loop ran it; freed in member order (the pool first), destroying it touched
// the freed pool (an ASan heap-use-after-free).
BOOST_AUTO_TEST_CASE(runtime_destroys_handlers_queued_across_its_executors_while_both_exist) {
    std::atomic<bool> queued{false};
    {
        app::runtime rt(lenient(), logger(std::make_shared<memory_sink>(), log_level::debug));
        auto main = rt.io().get_executor();
        auto pool = rt.offload().get_executor();
        asio::post(pool, [main, pool, &queued] {
            asio::post(main, [work = asio::make_work_guard(pool)] {});
            queued = true;
        });
        while (!queued) std::this_thread::yield();  // the test's thread: the main loop never runs here
    }
    BOOST_TEST(queued.load());
}
