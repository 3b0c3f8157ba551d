#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <thread>

#include "net/address.hpp"
#include "net/error.hpp"
#include "net/lag_probe.hpp"
#include "net/offload.hpp"
#include "net/resolve.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(host_port_parsing) {
    auto a = net::parse_host_port("127.0.0.1:9180");
    BOOST_REQUIRE(a.has_value());
    BOOST_TEST(a->host == "127.0.0.1");
    BOOST_TEST(a->port == 9180);
    auto b = net::parse_host_port("[::1]:4150");
    BOOST_REQUIRE(b.has_value());
    BOOST_TEST(b->host == "::1");
    BOOST_TEST(b->to_string() == "[::1]:4150");
    auto c = net::parse_host_port(":0");
    BOOST_REQUIRE(c.has_value());
    BOOST_TEST(c->host == "127.0.0.1");
    for (auto bad : {"nohost", "h:99999", "h:", "h:12x", "::1:80", "[::1]80"}) {
        auto r = net::parse_host_port(bad);
        BOOST_TEST(!r.has_value(), bad);
        if (!r) BOOST_TEST((r.code() == net::errc::bad_address));
    }
}

namespace {
asio::awaitable<int> slow_value(std::chrono::milliseconds d) {
    co_await net::sleep_for(d);
    co_return 7;
}

asio::awaitable<std::pair<std::optional<int>, std::optional<int>>> race() {
    auto fast = co_await net::with_timeout(slow_value(5ms), 2s);
    auto slow = co_await net::with_timeout(slow_value(2s), 20ms);
    co_return std::pair{fast, slow};
}

asio::awaitable<std::thread::id> thread_id() {
    co_return std::this_thread::get_id();
}

struct offload_seen {
    std::thread::id worker, resumed;
};
asio::awaitable<offload_seen> hop(net::offload_pool* pool) {
    offload_seen s;
    s.worker = co_await net::offload(pool->get_executor(), thread_id());
    s.resumed = std::this_thread::get_id();
    co_return s;
}

asio::awaitable<int> thrower() {
    throw std::runtime_error("boom");
    co_return 0;
}
asio::awaitable<std::string> offload_throw(net::offload_pool* pool) {
    try {
        co_await net::offload(pool->get_executor(), thrower());
    } catch (const std::runtime_error& e) {
        co_return e.what();
    }
    co_return "no exception";
}
}  // namespace

BOOST_AUTO_TEST_CASE(with_timeout_returns_value_or_nullopt) {
    auto [fast, slow] = test::run_async([] { return race(); });
    BOOST_REQUIRE(fast.has_value());
    BOOST_TEST(*fast == 7);
    BOOST_TEST(!slow.has_value());
}

BOOST_AUTO_TEST_CASE(offload_runs_elsewhere_and_resumes_on_caller) {
    asio::io_context io;  // declared first: the pool's threads may still release work on it as they finish
    net::offload_pool pool(2);
    auto seen = test::run_async(io, [&] { return hop(&pool); });
    BOOST_TEST((seen.worker != std::this_thread::get_id()));
    BOOST_TEST((seen.resumed == std::this_thread::get_id()));  // run_async drives io on this thread
    BOOST_TEST(test::run_async(io, [&] { return offload_throw(&pool); }) == "boom");
}

BOOST_AUTO_TEST_CASE(tls_context_errors_are_clear) {
    auto bad = net::make_tls_client_context({.ca_file = "/nonexistent/ca.pem"});
    BOOST_REQUIRE(!bad.has_value());
    BOOST_TEST((bad.code() == net::errc::tls_setup_failed));
    BOOST_TEST(bad.err().message.find("/nonexistent/ca.pem") != std::string::npos);
    auto sys = net::make_tls_client_context({});
    BOOST_REQUIRE(sys.has_value());
    BOOST_TEST((SSL_CTX_get_verify_mode((*sys)->native_handle()) & SSL_VERIFY_PEER) != 0);
    auto srv = net::make_tls_server_context(
        {.cert_file = "/nonexistent/cert.pem", .key_file = "/nonexistent/key.pem"});
    BOOST_TEST(!srv.has_value());
}

BOOST_AUTO_TEST_CASE(lag_probe_sees_a_blocked_loop) {
    asio::io_context io;
    std::vector<double> samples;
    auto probe =
        std::make_shared<net::lag_probe>(io.get_executor(), 10ms, [&](double s) { samples.push_back(s); });
    probe->start();
    io.run_for(50ms);
    BOOST_TEST(probe->recent_max_lag(5s) < 0.2);
    // Block the loop on purpose: the next tick fires ~150 ms late.
    auto before = samples.size();
    asio::post(io, [] { std::this_thread::sleep_for(150ms); });
    io.run_one_for(1s);                             // runs the blocking handler
    BOOST_TEST(probe->recent_max_lag(5s) >= 0.14);  // overdue tick is visible before it runs
    while (samples.size() == before) io.run_one_for(1s);
    BOOST_TEST(samples.back() >= 0.14);
    BOOST_TEST(samples.back() < 1.0);
    probe->stop();
    io.run_for(30ms);
}

namespace {
asio::awaitable<result<int>> parse_on_worker(int v) {
    if (v < 0) co_return error(core_errc::out_of_range, "negative");
    co_return v * 2;
}
// Returns (value of the good result, code of the bad one); run_async itself needs a default-constructible T.
asio::awaitable<std::pair<int, std::error_code>> offload_results(net::offload_pool* pool) {
    result<int> ok = co_await net::offload(pool->get_executor(), parse_on_worker(21));
    result<int> bad = co_await net::offload(pool->get_executor(), parse_on_worker(-1));
    co_return std::pair{ok.has_value() ? *ok : -1, bad.code()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(offload_carries_results_without_default_constructor) {
    asio::io_context io;
    net::offload_pool pool(1);
    auto [ok, bad] = test::run_async(io, [&] { return offload_results(&pool); });
    BOOST_TEST(ok == 42);
    BOOST_TEST((bad == core_errc::out_of_range));
}

// ---- resolve(): a deadline that a hung lookup cannot outlive --------------------------------------------

namespace {

struct lookup_probe {
    net::resolve_handler held;  // a lookup that never answers (until the test says so)
    int started = 0;
};

asio::awaitable<std::pair<std::string, double>> hung_lookup(lookup_probe* p) {
    auto t0 = std::chrono::steady_clock::now();
    net::resolve_initiator start = [p](asio::ip::tcp::resolver&, net::resolve_handler h) {
        ++p->started;
        p->held = std::move(h);
    };
    auto r = co_await net::resolve_with(std::move(start), "stuck.example", 150ms);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    co_return std::pair(r ? std::string("answer") : r.err().message, took);
}

asio::awaitable<std::pair<std::string, double>> hung_lookup_dropped(lookup_probe* p) {
    auto r = co_await hung_lookup(p);
    p->held = nullptr;  // the lookup's state goes while its io_context still exists
    co_return r;
}

asio::awaitable<std::string> late_answer_after_timeout(lookup_probe* p) {
    auto r = co_await hung_lookup(p);
    // The abandoned lookup answers now: nothing must touch the finished wait (ASan would see it).
    p->held(std::error_code{}, net::resolve_results{});
    p->held = nullptr;
    co_await net::sleep_for(10ms);
    co_return r.first;
}

asio::awaitable<std::string> outer_timeout_cuts_the_lookup(lookup_probe* p) {
    // An enclosing `op || timer` (a request deadline) ends the wait too, long before resolve's own.
    net::resolve_initiator start = [p](asio::ip::tcp::resolver&, net::resolve_handler h) {
        p->held = std::move(h);
    };
    auto r = co_await net::with_timeout(net::resolve_with(std::move(start), "stuck.example", 60s), 100ms);
    p->held = nullptr;
    co_return r ? std::string("finished") : std::string("timed out");
}

asio::awaitable<std::string> resolve_localhost() {
    auto r = co_await net::resolve("127.0.0.1", "4150", 5s);
    if (!r) co_return r.err().message;
    co_return r->begin()->endpoint().address().to_string() + ":" +
        std::to_string(r->begin()->endpoint().port());
}

}  // namespace

BOOST_AUTO_TEST_CASE(resolve_gives_up_on_a_hung_lookup_at_its_deadline) {
    lookup_probe p;
    auto [what, took] = test::run_async([&] { return hung_lookup_dropped(&p); });
    BOOST_TEST(p.started == 1);
    BOOST_TEST(what == "resolve stuck.example: no answer within 150 ms");
    BOOST_TEST(took >= 0.15);
    BOOST_TEST(took < 2.0);
}

BOOST_AUTO_TEST_CASE(an_abandoned_lookup_may_answer_later) {
    lookup_probe p;
    BOOST_TEST(test::run_async([&] { return late_answer_after_timeout(&p); }) ==
               "resolve stuck.example: no answer within 150 ms");
}

BOOST_AUTO_TEST_CASE(an_enclosing_timeout_ends_the_lookup_wait) {
    lookup_probe p;
    auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(test::run_async([&] { return outer_timeout_cuts_the_lookup(&p); }) == "timed out");
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 5s);  // not resolve's own 60 s
}

BOOST_AUTO_TEST_CASE(resolve_answers_a_numeric_host) {
    BOOST_TEST(test::run_async([] { return resolve_localhost(); }) == "127.0.0.1:4150");
}
