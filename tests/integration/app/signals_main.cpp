// SIGTERM → bounded, structured shutdown that runs the drains; a second signal stops at once.
#define BOOST_TEST_MODULE shutdown_signals
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <csignal>
#include <thread>

#include "app/runtime.hpp"
#include "net/timeout.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

app::runtime_options opts(std::chrono::milliseconds shutdown_timeout) {
    app::runtime_options o;
    o.health_listen = {"127.0.0.1", 0};
    o.shutdown_timeout = shutdown_timeout;
    return o;
}

// Raises `sig` once the loop is running (the signal handler is installed by start()).
void raise_from_loop(app::runtime& rt, int sig) {
    asio::post(rt.io(), [sig] { ::kill(::getpid(), sig); });
}

asio::awaitable<void> drain_quickly(bool* done) {
    co_await net::sleep_for(20ms);
    *done = true;
}

asio::awaitable<void> drain_forever() {
    co_await net::sleep_for(1h);
}

asio::awaitable<void> signal_again_once_stopping(app::runtime* rt) {
    while (!rt->stopping()) co_await net::sleep_for(5ms);
    ::kill(::getpid(), SIGTERM);
}

}  // namespace

BOOST_AUTO_TEST_CASE(sigterm_runs_drains_and_exits_zero) {
    auto sink = std::make_shared<memory_sink>();
    app::runtime rt(opts(5000ms), logger(sink, log_level::info));
    bool drained = false;
    rt.on_shutdown([&drained] { return drain_quickly(&drained); });
    BOOST_REQUIRE(rt.start().has_value());
    raise_from_loop(rt, SIGTERM);
    BOOST_TEST(rt.run() == 0);
    BOOST_TEST(drained);
    BOOST_TEST(sink->contains("\"reason\":\"SIGTERM\""));
    BOOST_TEST(sink->contains("\"msg\":\"shutdown complete\""));
}

BOOST_AUTO_TEST_CASE(shutdown_is_bounded_by_the_timeout) {
    app::runtime rt(opts(200ms), logger());
    rt.on_shutdown([] { return drain_forever(); });
    BOOST_REQUIRE(rt.start().has_value());
    raise_from_loop(rt, SIGINT);
    auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(rt.run() == 1);  // drain abandoned: not a clean exit
    auto took = std::chrono::steady_clock::now() - t0;
    BOOST_TEST(took >= 190ms);
    BOOST_TEST(took < 3s);
}

BOOST_AUTO_TEST_CASE(second_signal_stops_at_once) {
    auto sink = std::make_shared<memory_sink>();
    app::runtime rt(opts(60000ms), logger(sink, log_level::info));
    rt.on_shutdown([] { return drain_forever(); });
    BOOST_REQUIRE(rt.start().has_value());
    raise_from_loop(rt, SIGTERM);
    // The second signal only once the first has been handled (shutdown requested).
    asio::co_spawn(rt.io(), signal_again_once_stopping(&rt), asio::detached);
    auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(rt.run() == 130);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));
    BOOST_TEST(sink->contains("second signal"));
}

// SIGHUP drains exactly like SIGTERM (no reload): the drains run, and the exit code is 129, not 0, so a
// supervisor restarting on failure (systemd Restart=on-failure) brings the service back.
BOOST_AUTO_TEST_CASE(sighup_drains_like_sigterm_and_exits_non_zero) {
    auto sink = std::make_shared<memory_sink>();
    app::runtime rt(opts(5000ms), logger(sink, log_level::info));
    bool drained = false;
    rt.on_shutdown([&drained] { return drain_quickly(&drained); });
    BOOST_REQUIRE(rt.start().has_value());
    raise_from_loop(rt, SIGHUP);
    BOOST_TEST(rt.run() == app::exit_hangup);
    BOOST_TEST(app::exit_hangup == 129);
    BOOST_TEST(drained);
    BOOST_TEST(sink->contains("\"reason\":\"SIGHUP\""));
    BOOST_TEST(sink->contains("\"msg\":\"shutdown complete\""));
}
