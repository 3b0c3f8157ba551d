// http::server under a connection flood: 1 100 TCP connections that never send a byte (never start TLS)
// are held open while a well-behaved client keeps probing. The server sheds the oldest connection that has
// not completed a request, so every probe is answered, and a client that had completed a request keeps its
// connection while there are such connections to shed. Plain HTTP (the health listener) and TLS (the vault
// proxy's listener). Prints the probes' latency under flood.
#define BOOST_TEST_MODULE http_flood
#include <sys/resource.h>

#include <algorithm>
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/ssl/stream.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include "http/proto/parser.hpp"
#include "http/server.hpp"
#include "net/tls.hpp"
#include "support/raw_http.hpp"
#include "support/test_certs.hpp"

using namespace cg;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::size_t flood_size = 1100;

asio::awaitable<http::response> probe_handler(http::request&) {
    co_return http::make_response(200, "ok\n");
}

// Room for the flood's client and server ends: the soft limit is often 1024.
void raise_fd_limit() {
    rlimit rl{};
    BOOST_TEST_REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = rl.rlim_max;
    BOOST_TEST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 2 * flood_size + 100)
        BOOST_FAIL("RLIMIT_NOFILE hard limit " << rl.rlim_cur << " is too low for " << flood_size
                                               << " connections");
}

struct running_server {
    asio::io_context io{1};
    std::unique_ptr<http::server> srv;
    unsigned short port = 0;
    std::thread t;

    explicit running_server(http::server_options o) {
        http::router r;
        r.add("GET", "/probe", probe_handler);
        srv = std::make_unique<http::server>(io.get_executor(), std::move(r), std::move(o), logger());
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
    // Reads the server's counters on its own thread: {open, shed, refused}.
    std::array<std::uint64_t, 3> counts() {
        std::promise<std::array<std::uint64_t, 3>> p;
        asio::post(io, [&] {
            p.set_value({srv->open_connections(), srv->shed_connections(), srv->refused_connections()});
        });
        return p.get_future().get();
    }
};

// Connections that never send anything (blocking connects from the test thread).
struct flood {
    asio::io_context io;
    std::vector<asio::ip::tcp::socket> socks;
    flood(unsigned short port, std::size_t n) {
        socks.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            socks.emplace_back(io);
            socks.back().connect({asio::ip::make_address("127.0.0.1"), port});
        }
    }
};

// Waits until the server has accepted every flood connection (each one is either open or was shed).
void await_accepted(running_server& s, std::size_t n) {
    auto end = clock_type::now() + 60s;
    for (;;) {
        auto [open, shed, refused] = s.counts();
        if (open + shed + refused >= n) return;
        BOOST_TEST_REQUIRE((clock_type::now() < end), "accepted " << open + shed + refused << " of " << n);
        std::this_thread::sleep_for(10ms);
    }
}

// One TLS request on a new connection, verifying the server against the test CA.
int tls_probe(unsigned short port) {
    asio::io_context io;
    asio::ssl::context ctx(asio::ssl::context::tls_client);
    ctx.load_verify_file(test::cert("ca.pem"));
    ctx.set_verify_mode(asio::ssl::verify_peer);
    asio::ssl::stream<asio::ip::tcp::socket> s(io, ctx);
    s.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
    s.handshake(asio::ssl::stream_base::client);
    std::string req = "GET /probe HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    asio::write(s, asio::buffer(req));
    http::response_parser p;
    std::string buf;
    for (;;) {
        char chunk[4096];
        std::error_code ec;
        auto n = s.read_some(asio::buffer(chunk), ec);
        if (ec) p.feed_eof();
        buf.append(chunk, ec ? 0 : n);
        buf.erase(0, p.feed(buf));
        if (p.state() == http::parse_state::done) return p.message().status;
        if (ec || p.state() == http::parse_state::failed) return -1;
    }
}

struct latencies {
    std::vector<double> ms;
    void add(clock_type::duration d) { ms.push_back(std::chrono::duration<double, std::milli>(d).count()); }
    void print(const char* what) {
        std::sort(ms.begin(), ms.end());
        std::printf("%s: %zu probes under a flood of %zu idle connections: p50 %.2f ms, max %.2f ms\n", what,
                    ms.size(), flood_size, ms[ms.size() / 2], ms.back());
    }
};

}  // namespace

BOOST_AUTO_TEST_CASE(plain_probes_answered_while_idle_connections_flood) {
    raise_fd_limit();
    http::server_options o;  // the health listener's defaults: 512 connections
    running_server s(o);
    // A client that completed a request before the flood: connections that never did go first.
    test::raw_http regular(s.port);
    BOOST_TEST(regular.get("/probe").status == 200);

    flood f(s.port, flood_size);
    await_accepted(s, flood_size + 1);
    latencies lat;
    for (int i = 0; i < 20; ++i) {
        auto t0 = clock_type::now();
        BOOST_TEST(test::http_get(s.port, "/probe").status == 200);
        lat.add(clock_type::now() - t0);
    }
    BOOST_TEST(regular.get("/probe").status == 200);  // kept its connection through the flood
    auto [open, shed, refused] = s.counts();
    BOOST_TEST(open <= o.max_connections);
    BOOST_TEST(shed >= flood_size + 1 - o.max_connections);  // the flood displaced itself
    BOOST_TEST(refused == 0u);
    lat.print("plain");
}

BOOST_AUTO_TEST_CASE(tls_probes_answered_while_connections_never_start_tls) {
    raise_fd_limit();
    auto tls = net::make_tls_server_context({test::cert("server.pem"), test::cert("server.key")});
    BOOST_TEST_REQUIRE(tls.has_value());
    http::server_options o;
    o.max_connections = 1024;  // the vault proxy's --max-connections default
    o.tls = *tls;
    running_server s(o);
    flood f(s.port, flood_size);
    await_accepted(s, flood_size);
    latencies lat;
    for (int i = 0; i < 20; ++i) {
        auto t0 = clock_type::now();
        BOOST_TEST(tls_probe(s.port) == 200);
        lat.add(clock_type::now() - t0);
    }
    auto [open, shed, refused] = s.counts();
    BOOST_TEST(open <= o.max_connections);
    BOOST_TEST(shed >= flood_size - o.max_connections);
    lat.print("tls");
}

BOOST_AUTO_TEST_CASE(idle_connection_gets_the_handshake_deadline) {
    http::server_options o;
    auto tls = net::make_tls_server_context({test::cert("server.pem"), test::cert("server.key")});
    BOOST_TEST_REQUIRE(tls.has_value());
    o.tls = *tls;
    o.handshake_timeout = 200ms;  // read_timeout stays 30 s: the handshake deadline is what closes it
    running_server s(o);
    auto t0 = clock_type::now();
    test::raw_http idle(s.port);
    BOOST_TEST(idle.closed_by_peer());
    auto waited = clock_type::now() - t0;
    BOOST_TEST((waited >= 200ms && waited < 10s));
}

BOOST_AUTO_TEST_CASE(first_request_deadline_is_shorter_than_the_read_timeout) {
    http::server_options o;
    o.first_request_timeout = 200ms;  // read_timeout stays 30 s
    running_server s(o);
    auto t0 = clock_type::now();
    test::raw_http idle(s.port);
    BOOST_TEST(idle.closed_by_peer());
    auto waited = clock_type::now() - t0;
    BOOST_TEST((waited >= 200ms && waited < 10s));
}
