// http::server over real sockets: slow clients are cut off, handler failures become 500s, a handler can
// drop the connection, the connection limit holds (shedding idle connections, never a running request), the
// budget of bytes buffered across connections sheds the read that would exceed it, and a router's handlers
// may take bodies the server left in the connection.
#define BOOST_TEST_MODULE http_server
#include "http/server.hpp"

#include <asio/io_context.hpp>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <future>
#include <string>
#include <thread>

#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "support/raw_http.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

asio::awaitable<http::response> fail_handler(http::request&) {
    throw std::runtime_error("handler bug");
    co_return http::response{};
}
asio::awaitable<http::response> drop_handler(http::request&) {
    http::response r;
    r.abort_connection = true;
    co_return r;
}
asio::awaitable<http::response> slow_handler(http::request&) {
    co_await net::sleep_for(50ms);
    co_return http::make_response(200, "slow");
}
// Requests being handled right now (/hold stays in its handler for a second).
std::atomic<int> holding{0};
asio::awaitable<http::response> hold_handler(http::request&) {
    ++holding;
    co_await net::sleep_for(1s);
    --holding;
    co_return http::make_response(200, "held");
}

// A router that leaves bodies unread (router::leave_bodies_unread): what its handler last saw of the body —
// the bytes already in `body`, those left in the connection, and a peek at the whole.
struct unread_view {
    std::size_t in_body = 0, unread = 0;
    std::string peeked;
};
unread_view seen;
void look(const http::request& req) {
    seen = {req.body.size(), req.unread_body, req.peek_body().value_or("<connection gone>")};
}
// Takes the body and answers it.
asio::awaitable<http::response> take_handler(http::request& req) {
    look(req);
    if (!req.take_body()) co_return http::make_response(500, "connection gone");
    co_return http::make_response(200, req.body);
}
// Answers without taking the body: the server consumes it.
asio::awaitable<http::response> leave_handler(http::request& req) {
    look(req);
    co_return http::make_response(200, "left " + std::to_string(req.body_size()));
}

// chargeguard_http_shed_total{listener="test",reason=…} as rendered; -1 when the sample is missing.
double shed_count(const metrics::registry& reg, const std::string& reason) {
    const std::string text = reg.render();
    const std::string head = "chargeguard_http_shed_total{listener=\"test\",reason=\"" + reason + "\"} ";
    auto at = text.find(head);
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + head.size(), text.find('\n', at) - at - head.size()));
}

struct running_server {
    asio::io_context io{1};
    std::shared_ptr<memory_sink> sink = std::make_shared<memory_sink>();
    std::unique_ptr<http::server> srv;
    unsigned short port = 0;
    std::thread t;

    explicit running_server(http::server_options o, bool bodies_unread = false) {
        http::router r;
        r.add("POST", "/take", take_handler);
        r.add("POST", "/leave", leave_handler);
        if (bodies_unread) r.leave_bodies_unread();
        r.add("GET", "/fail", fail_handler);
        r.add("GET", "/drop", drop_handler);
        r.add("GET", "/slow", slow_handler);
        r.add("GET", "/hold", hold_handler);
        r.add("POST", "/hold", hold_handler);
        srv = std::make_unique<http::server>(io.get_executor(), std::move(r), std::move(o),
                                             logger(sink, log_level::debug));
        auto ep = srv->listen({"127.0.0.1", 0});
        BOOST_REQUIRE(ep.has_value());
        port = ep->port();
        srv->start();
        t = std::thread([this] { io.run(); });
    }
    ~running_server() {
        asio::post(io, [this] { srv->stop(); });
        t.join();
    }
};

// The server's bytes buffered and not yet answered, read on its loop.
std::size_t buffered(running_server& s) {
    std::promise<std::size_t> p;
    asio::post(s.io, [&] { p.set_value(s.srv->buffered_bytes()); });
    return p.get_future().get();
}

}  // namespace

BOOST_AUTO_TEST_CASE(handler_exception_is_500_and_logged) {
    running_server s({});
    BOOST_TEST(test::http_get(s.port, "/fail").status == 500);
    BOOST_TEST(s.sink->contains("handler bug"));
    BOOST_TEST(test::http_get(s.port, "/slow").body == "slow");
}

BOOST_AUTO_TEST_CASE(abort_connection_drops_without_answer) {
    running_server s({});
    test::raw_http c(s.port);
    BOOST_CHECK_THROW(c.get("/drop"), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(slow_client_is_cut_off) {
    http::server_options o;
    o.read_timeout = 200ms;
    running_server s(o);
    auto t0 = std::chrono::steady_clock::now();  // before connecting: the deadline starts at accept
    test::raw_http c(s.port);
    c.exchange_partial("GET /slow HTTP/1.1\r\nHost: x\r\n");  // never finishes its headers
    BOOST_TEST(c.closed_by_peer());
    auto waited = std::chrono::steady_clock::now() - t0;
    BOOST_TEST((waited >= 200ms && waited < 5s));
}

// At the limit with every connection in the middle of a request, a new connection is refused; the requests
// in progress are not cut.
BOOST_AUTO_TEST_CASE(connection_limit_holds_while_requests_run) {
    metrics::registry reg;
    http::server_options o;
    o.max_connections = 2;
    o.metrics = &reg;
    o.listener = "test";
    running_server s(o);
    test::raw_http a(s.port), b(s.port);
    a.exchange_partial("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    b.exchange_partial("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    while (holding.load() < 2) std::this_thread::yield();  // both are in their handler
    BOOST_TEST(shed_count(reg, "refused") == 0.0);
    test::raw_http c(s.port);  // accepted by the kernel, closed by the server
    BOOST_TEST(c.closed_by_peer());
    BOOST_TEST(shed_count(reg, "refused") == 1.0);
    BOOST_TEST(shed_count(reg, "make_room") == 0.0);
    BOOST_TEST(a.read_response().body == "held");
    BOOST_TEST(b.read_response().body == "held");
}

// At the limit with kept-alive connections idle between requests, a new connection sheds the oldest of them
// (its client would reconnect) instead of being refused.
BOOST_AUTO_TEST_CASE(connection_limit_sheds_the_oldest_idle_keep_alive) {
    metrics::registry reg;
    http::server_options o;
    o.max_connections = 2;
    o.metrics = &reg;
    o.listener = "test";
    running_server s(o);
    test::raw_http a(s.port), b(s.port);
    BOOST_TEST(a.get("/slow").status == 200);
    BOOST_TEST(b.get("/slow").status == 200);
    test::raw_http c(s.port);
    BOOST_TEST(c.get("/slow").status == 200);
    BOOST_TEST(a.closed_by_peer());  // the oldest idle one made room
    BOOST_TEST(shed_count(reg, "make_room") == 1.0);
    BOOST_TEST(shed_count(reg, "refused") == 0.0);
    BOOST_TEST(b.get("/slow").status == 200);  // the other still works
}

// Bytes read and not yet answered count against one budget across connections: a body held by a running
// handler leaves no room for another that would exceed it (503, Retry-After, closed), and its answer gives
// the room back.
BOOST_AUTO_TEST_CASE(the_buffered_bytes_budget_sheds_the_read_over_it) {
    metrics::registry reg;
    http::server_options o;
    o.max_buffered_bytes = 64 * 1024;
    o.metrics = &reg;
    o.listener = "test";
    running_server s(o);
    const std::string post =
        "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 40960\r\n\r\n" + std::string(40960, 'b');
    test::raw_http a(s.port);
    a.exchange_partial(post);
    while (holding.load() < 1) std::this_thread::yield();  // its 40 KiB are held by the handler
    test::raw_http b(s.port);
    BOOST_TEST(shed_count(reg, "buffered_bytes") == 0.0);
    auto shed = b.exchange(post);
    BOOST_TEST(shed.status == 503);
    // Counted before the answer is written, once per request shed, and apart from connection shedding.
    BOOST_TEST(shed_count(reg, "buffered_bytes") == 1.0);
    BOOST_TEST(shed_count(reg, "make_room") == 0.0);
    BOOST_TEST(shed_count(reg, "refused") == 0.0);
    BOOST_TEST(shed.headers.get("Retry-After").value_or("") == "5");
    BOOST_TEST(b.closed_by_peer());
    BOOST_TEST(a.read_response().body == "held");
    // Answered: the room is back, for the same connection and for another.
    BOOST_TEST(a.exchange(post).status == 200);
    test::raw_http c(s.port);
    BOOST_TEST(c.exchange(post).status == 200);
    BOOST_TEST(shed_count(reg, "buffered_bytes") == 1.0);
}

// A handler that takes its body finds it in the connection, not in the request, until it takes it; a peek
// leaves it there. Requests on the same kept-alive connection follow one another as before.
BOOST_AUTO_TEST_CASE(a_body_that_has_arrived_waits_in_the_connection_for_its_handler) {
    running_server s({}, true);
    test::raw_http c(s.port);
    auto r = c.exchange("POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
    BOOST_TEST(r.status == 200);
    BOOST_TEST(r.body == "hello world");
    BOOST_TEST(seen.in_body == 0u);
    BOOST_TEST(seen.unread == 11u);
    BOOST_TEST(seen.peeked == "hello world");
    r = c.exchange("POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsecond");
    BOOST_TEST(r.body == "second");
    BOOST_TEST(seen.unread == 6u);
    // Without a body, nothing is left unread.
    BOOST_TEST(c.exchange("POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").body == "");
    BOOST_TEST(seen.unread == 0u);
}

// What a handler leaves of its body is consumed after its answer: the next request on the connection is
// parsed from its own first byte, not from the left body.
BOOST_AUTO_TEST_CASE(a_body_the_handler_left_is_consumed_before_the_next_request) {
    running_server s({}, true);
    test::raw_http c(s.port);
    auto r = c.exchange("POST /leave HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabcdef");
    BOOST_TEST(r.body == "left 6");
    BOOST_TEST(seen.unread == 6u);
    r = c.exchange("POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz");
    BOOST_TEST(r.status == 200);
    BOOST_TEST(r.body == "xyz");
}

// A body still arriving when the head is read is read as it comes: the handler gets it in the request.
BOOST_AUTO_TEST_CASE(a_body_still_arriving_is_read_into_the_request) {
    running_server s({}, true);
    test::raw_http c(s.port);
    const std::string head = "POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
    c.exchange_partial(head + "he");
    // The rest is sent once the server has read the head and what there was of the body.
    while (buffered(s) < head.size() + 2) std::this_thread::yield();
    auto r = c.exchange("llo");
    BOOST_TEST(r.body == "hello");
    BOOST_TEST(seen.in_body == 5u);
    BOOST_TEST(seen.unread == 0u);
}

// A body left in the connection counts against the budget of bytes buffered as if it had been read.
BOOST_AUTO_TEST_CASE(a_body_left_in_the_connection_counts_against_the_budget) {
    metrics::registry reg;
    http::server_options o;
    o.max_buffered_bytes = 64;
    o.metrics = &reg;
    o.listener = "test";
    running_server s(o, true);
    test::raw_http c(s.port);
    auto r =
        c.exchange("POST /take HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'b'));
    BOOST_TEST(r.status == 503);
    BOOST_TEST(shed_count(reg, "buffered_bytes") == 1.0);
}
