// What the http::client tests share (client_test.cpp, client_pool_test.cpp): the foundation's http::server
// (plain or TLS) on the test's io_context with routes that echo, stall, gather or queue requests and log
// what they saw, the client's TLS context, and bursts of requests awaited together.
#pragma once

#include <openssl/ssl.h>

#include <asio/detached.hpp>
#include <asio/read_until.hpp>
#include <asio/streambuf.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "http/client.hpp"
#include "http/proto/error.hpp"
#include "http/server.hpp"
#include "net/error.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "support/run_async.hpp"
#include "support/test_certs.hpp"

using namespace std::chrono_literals;
namespace http = cg::http;
namespace net = cg::net;
using cg::test::cert;
using cg::test::run_async;

namespace {

inline std::shared_ptr<asio::ssl::context> client_tls(const char* ca = "ca.pem") {
    auto ctx = net::make_tls_client_context({cert(ca)});
    BOOST_TEST_REQUIRE(ctx.has_value());
    return *ctx;
}

// What the handlers saw; touched only on the server's (test) thread.
struct server_log {
    int hits = 0;
    int active = 0;
    int max_active = 0;
    std::chrono::steady_clock::time_point queue_free{};  // /queue: when its one "worker" is free again
    std::unique_ptr<net::steady_timer> gathered;         // /gather: cancelled once n requests are in
};

inline asio::awaitable<http::response> echo(http::request req) {
    auto r = http::make_response(200, req.body);
    r.headers.add("X-Method", req.method);
    r.headers.add("X-Target", req.target);
    r.headers.add("X-Host", std::string(req.headers.get("Host").value_or("")));
    co_return r;
}

inline asio::awaitable<http::response> slow(server_log* log, std::chrono::milliseconds d) {
    ++log->hits;
    log->max_active = std::max(log->max_active, ++log->active);
    co_await net::sleep_for(d);
    --log->active;
    co_return http::make_response(200, "slow\n");
}

// Answers nothing until `n` requests are being served at once (or a minute has passed: the test then fails
// on its counts instead of hanging), then answers them all.
inline asio::awaitable<http::response> gather(server_log* log, int n) {
    ++log->hits;
    log->max_active = std::max(log->max_active, ++log->active);
    if (!log->gathered)
        log->gathered = std::make_unique<net::steady_timer>(co_await asio::this_coro::executor,
                                                            std::chrono::steady_clock::now() + 60s);
    if (log->active >= n)
        log->gathered->cancel();
    else
        co_await log->gathered->async_wait();
    --log->active;
    co_return http::make_response(200, "gathered\n");
}

// A saturated origin: one request served at a time, each for `d`, so answers slow down as requests pile up.
inline asio::awaitable<http::response> queued(server_log* log, std::chrono::milliseconds d) {
    ++log->hits;
    log->max_active = std::max(log->max_active, ++log->active);
    auto start = std::max(std::chrono::steady_clock::now(), log->queue_free);
    log->queue_free = start + d;
    net::steady_timer t(co_await asio::this_coro::executor, start + d);
    co_await t.async_wait();
    --log->active;
    co_return http::make_response(200, "queued\n");
}

inline asio::awaitable<http::response> chunked() {
    auto r = http::make_response(200, "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n");
    r.headers.add("Transfer-Encoding", "chunked");
    co_return r;
}

inline http::router make_routes(server_log& log) {
    http::router r;
    r.add("", "/echo", [](http::request& q) { return echo(q); });
    r.add("GET", "/slow", [&log](http::request& q) {
        auto ms = std::stoi(http::query_param(q.query(), "ms").value_or("50"));
        return slow(&log, std::chrono::milliseconds(ms));
    });
    r.add("GET", "/queue", [&log](http::request& q) {
        auto ms = std::stoi(http::query_param(q.query(), "ms").value_or("20"));
        return queued(&log, std::chrono::milliseconds(ms));
    });
    r.add("GET", "/gather", [&log](http::request& q) {
        return gather(&log, std::stoi(http::query_param(q.query(), "n").value_or("1")));
    });
    r.add("GET", "/chunked", [](http::request&) { return chunked(); });
    r.add("GET", "/close", [](http::request&) -> asio::awaitable<http::response> {
        auto resp = http::make_response(200, "bye\n");
        resp.headers.add("Connection", "close");
        co_return resp;
    });
    r.add("POST", "/vanish", [](http::request&) -> asio::awaitable<http::response> {
        http::response resp;
        resp.abort_connection = true;
        co_return resp;
    });
    return r;
}

// A server on the test io_context plus an offload pool for clients.
struct fixture {
    net::loop_pair loops{2};
    asio::io_context& io = loops.io;
    net::offload_pool& pool = loops.offload;
    server_log log;
    std::unique_ptr<http::server> server;
    std::uint16_t port = 0;

    void start(bool tls, const char* host = "127.0.0.1") {
        http::server_options o;
        if (tls) {
            auto ctx = net::make_tls_server_context({cert("server.pem"), cert("server.key")});
            BOOST_TEST_REQUIRE(ctx.has_value());
            o.tls = *ctx;
        }
        server = std::make_unique<http::server>(io.get_executor(), make_routes(log), o, cg::logger());
        auto ep = server->listen({host, 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        port = ep->port();
        server->start();
    }
    // The handlers left on either loop go while the server and the log they may refer to exist.
    ~fixture() { loops.shut_down(); }

    std::unique_ptr<http::client> client(bool tls, http::client_options o = {},
                                         const char* host = "127.0.0.1") {
        if (tls && !o.tls) o.tls = client_tls();
        auto url = std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(port);
        auto c = http::client::create(pool.get_executor(), url, o, cg::logger());
        BOOST_TEST_REQUIRE(c.has_value());
        return std::move(*c);
    }
};

inline http::request get(std::string target) {
    http::request r;
    r.method = "GET";
    r.target = std::move(target);
    return r;
}

// Counts finished tasks and wakes the waiting test coroutine when all are done (one thread: io).
struct latch {
    explicit latch(asio::io_context& io, int n) : timer(io, net::steady_timer::time_point::max()), left(n) {}
    void done() {
        if (--left == 0) timer.cancel();
    }
    asio::awaitable<void> wait() {
        if (left > 0) co_await timer.async_wait();
    }
    net::steady_timer timer;
    int left;
};

inline asio::awaitable<void> get_into(http::client* c, std::string target, http::client_result* out,
                                      latch* l) {
    *out = co_await c->request(get(std::move(target)));
    l->done();
}

// `n` GETs of `target` started at once on `c`; returns when all have ended, with their results.
inline std::vector<http::client_result> burst(asio::io_context& io, http::client* c,
                                              const std::string& target, std::size_t n) {
    std::vector<http::client_result> results(n);
    run_async(io, [&]() -> asio::awaitable<void> {
        latch l(io, static_cast<int>(results.size()));
        for (auto& r : results) asio::co_spawn(io, get_into(c, target, &r, &l), asio::detached);
        co_await l.wait();
    });
    return results;
}

}  // namespace
