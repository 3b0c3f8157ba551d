// http::client against the foundation's http::server (plain and TLS) and a few raw sockets that
// misbehave on purpose. The server runs on the test's io_context; the client on an offload pool, as in
// production.
// Requests, TLS, timeouts and broken peers here (client_fixture.hpp); the connection pool's growth and bounds
// are client_pool_test.cpp.
#include <boost/test/unit_test.hpp>

#include "client_fixture.hpp"

BOOST_AUTO_TEST_SUITE(client)

BOOST_AUTO_TEST_CASE(plain_request_round_trip) {
    fixture f;
    f.start(false);
    auto c = f.client(false);
    auto r = run_async(f.io, [&]() -> asio::awaitable<http::client_result> {
        http::request req;
        req.method = "POST";
        req.target = "/echo?x=1";
        req.body = "amount=100&currency=usd";
        co_return co_await c->request(std::move(req));
    });
    BOOST_TEST_REQUIRE(r.ok(), r.err.describe());
    BOOST_TEST(r.resp.status == 200);
    BOOST_TEST(r.resp.body == "amount=100&currency=usd");
    BOOST_TEST(r.resp.headers.get("X-Method").value_or("") == "POST");
    BOOST_TEST(r.resp.headers.get("X-Target").value_or("") == "/echo?x=1");
    BOOST_TEST(r.resp.headers.get("X-Host").value_or("") == "127.0.0.1:" + std::to_string(f.port));
    BOOST_TEST(r.request_sent);
}

BOOST_AUTO_TEST_CASE(tls_keep_alive_one_handshake_for_many_requests) {
    fixture f;
    f.start(true);
    auto c = f.client(true);
    int ok = run_async(f.io, [&]() -> asio::awaitable<int> {
        int n = 0;
        for (int i = 0; i < 20; ++i) {
            auto r = co_await c->request(get("/echo"));
            if (r.ok() && r.resp.status == 200) ++n;
            BOOST_TEST(r.reused_connection == (i > 0));
        }
        co_return n;
    });
    BOOST_TEST(ok == 20);
    auto s = c->stats();
    BOOST_TEST(s.handshakes == 1u);
    BOOST_TEST(s.connects == 1u);
    BOOST_TEST(s.reused == 19u);
    BOOST_TEST(s.idle == 1u);
}

BOOST_AUTO_TEST_CASE(wrong_ca_is_a_clear_tls_error) {
    fixture f;
    f.start(true);
    http::client_options o;
    o.tls = client_tls("other-ca.pem");
    auto c = f.client(true, o);
    auto r = run_async(f.io, [&]() { return c->request(get("/echo")); });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(net::errc::tls_verify_failed));
    BOOST_TEST_MESSAGE(r.err.message);
    BOOST_TEST(r.err.message.find("TLS handshake with https://127.0.0.1") != std::string::npos);
    BOOST_TEST(r.err.message.find("unable to get local issuer certificate") != std::string::npos);
    BOOST_TEST(!r.request_sent);
    BOOST_TEST(f.log.hits == 0);
}

BOOST_AUTO_TEST_CASE(host_name_mismatch_is_refused) {
    // The certificate names localhost and 127.0.0.1; a server reached as 127.0.0.2 must be refused.
    fixture f;
    f.start(true, "127.0.0.2");
    auto c = f.client(true, {}, "127.0.0.2");
    auto r = run_async(f.io, [&]() { return c->request(get("/echo")); });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(net::errc::tls_verify_failed));
    BOOST_TEST(r.err.message.find("mismatch") != std::string::npos, r.err.message);
}

BOOST_AUTO_TEST_CASE(localhost_name_verifies) {
    fixture f;
    f.start(true);
    auto c = f.client(true, {}, "localhost");
    auto r = run_async(f.io, [&]() { return c->request(get("/echo")); });
    // localhost may resolve to ::1 first; the client must fall through to 127.0.0.1.
    BOOST_TEST_REQUIRE(r.ok(), r.err.describe());
    BOOST_TEST(r.resp.status == 200);
}

BOOST_AUTO_TEST_CASE(chunked_response_body_is_decoded) {
    fixture f;
    f.start(true);
    auto c = f.client(true);
    auto r = run_async(f.io, [&]() { return c->request(get("/chunked")); });
    BOOST_TEST_REQUIRE(r.ok(), r.err.describe());
    BOOST_TEST(r.resp.body == "hello, world");
}

BOOST_AUTO_TEST_CASE(stalled_server_times_out_after_send) {
    fixture f;
    f.start(true);
    http::client_options o;
    o.request_timeout = 500ms;  // covers connect + TLS handshake too: room for a slow (ASan) machine
    auto c = f.client(true, o);
    auto t0 = std::chrono::steady_clock::now();
    auto r = run_async(f.io, [&]() { return c->request(get("/slow?ms=10000")); });
    auto took = std::chrono::steady_clock::now() - t0;
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(http::errc::timeout));
    BOOST_TEST(r.request_sent);
    BOOST_TEST(took < 5000ms);
    BOOST_TEST(f.log.hits == 1);
    // The timed-out connection is never pooled.
    BOOST_TEST(c->stats().idle == 0u);
}

asio::awaitable<void> accept_and_hold(net::tcp_acceptor* acc, net::tcp_socket* held) {
    auto [ec, s] = co_await acc->async_accept();
    if (!ec) *held = std::move(s);
}

BOOST_AUTO_TEST_CASE(silent_tls_peer_times_out_before_send) {
    fixture f;
    net::tcp_acceptor acc(f.io, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    net::tcp_socket held(f.io);
    asio::co_spawn(f.io, accept_and_hold(&acc, &held), asio::detached);
    f.port = acc.local_endpoint().port();
    http::client_options o;
    o.connect_timeout = 100ms;
    auto c = f.client(true, o);
    auto r = run_async(f.io, [&]() { return c->request(get("/echo")); });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(http::errc::timeout));
    BOOST_TEST(r.err.message.find("connect") != std::string::npos);
    BOOST_TEST(!r.request_sent);
}

// Set by the client context's info callback on the thread where OpenSSL finished a handshake.
std::atomic<int> handshakes_on_loop{0}, handshakes_elsewhere{0};
std::thread::id loop_thread;

// The client on the event loop (the test's io_context), connects on the offload pool: the TLS handshake
// computes on a pool thread, kept-alive requests run on the loop, and the connection handed back is reused.
BOOST_AUTO_TEST_CASE(connect_executor_keeps_handshakes_off_the_loop) {
    fixture f;
    f.start(true);
    loop_thread = std::this_thread::get_id();
    http::client_options o;
    o.tls = client_tls();
    o.connect_executor = f.pool.get_executor();
    SSL_CTX_set_info_callback(o.tls->native_handle(), [](const SSL*, int where, int) {
        if (!(where & SSL_CB_HANDSHAKE_DONE)) return;
        ++(std::this_thread::get_id() == loop_thread ? handshakes_on_loop : handshakes_elsewhere);
    });
    auto c = http::client::create(f.io.get_executor(), "https://127.0.0.1:" + std::to_string(f.port), o,
                                  cg::logger());
    BOOST_TEST_REQUIRE(c.has_value());
    int ok = run_async(f.io, [&]() -> asio::awaitable<int> {
        int n = 0;
        for (int i = 0; i < 5; ++i) {
            auto r = co_await (*c)->request(get("/echo"));
            if (r.ok() && r.resp.status == 200) ++n;
            BOOST_TEST(r.reused_connection == (i > 0));
            BOOST_TEST((std::this_thread::get_id() == loop_thread));
        }
        co_return n;
    });
    BOOST_TEST(ok == 5);
    BOOST_TEST(handshakes_elsewhere.load() == 1);
    BOOST_TEST(handshakes_on_loop.load() == 0);
    BOOST_TEST((*c)->stats().handshakes == 1u);
}

// A connect that never completes its handshake times out on the connect executor and comes back as a
// timeout before anything was sent.
BOOST_AUTO_TEST_CASE(connect_executor_connect_timeout) {
    fixture f;
    net::tcp_acceptor acc(f.io, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    net::tcp_socket held(f.io);
    asio::co_spawn(f.io, accept_and_hold(&acc, &held), asio::detached);
    http::client_options o;
    o.tls = client_tls();
    o.connect_timeout = 100ms;
    o.connect_executor = f.pool.get_executor();
    auto c = http::client::create(f.io.get_executor(),
                                  "https://127.0.0.1:" + std::to_string(acc.local_endpoint().port()), o,
                                  cg::logger());
    BOOST_TEST_REQUIRE(c.has_value());
    auto r = run_async(f.io, [&]() { return (*c)->request(get("/echo")); });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(http::errc::timeout));
    BOOST_TEST(r.err.message.find("connect") != std::string::npos);
    BOOST_TEST(!r.request_sent);
}

BOOST_AUTO_TEST_CASE(refused_connection_is_not_sent) {
    fixture f;
    {
        net::tcp_acceptor acc(f.io, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        f.port = acc.local_endpoint().port();
    }
    auto c = f.client(false);
    auto r = run_async(f.io, [&]() { return c->request(get("/echo")); });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == asio::error::connection_refused);
    BOOST_TEST(!r.request_sent);
}

BOOST_AUTO_TEST_CASE(peer_vanishing_after_request_is_sent) {
    fixture f;
    f.start(true);
    auto c = f.client(true);
    auto r = run_async(f.io, [&]() {
        http::request req;
        req.method = "POST";
        req.target = "/vanish";
        req.body = "x=1";
        return c->request(std::move(req));
    });
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.err.code == make_error_code(http::errc::connection_closed));
    BOOST_TEST(r.request_sent);
}

BOOST_AUTO_TEST_CASE(connection_close_is_honoured) {
    fixture f;
    f.start(true);
    auto c = f.client(true);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->request(get("/close"));
        auto b = co_await c->request(get("/echo"));
        BOOST_TEST(a.ok());
        BOOST_TEST(b.ok());
        BOOST_TEST(!b.reused_connection);
    });
    BOOST_TEST(c->stats().handshakes == 2u);
}

// A pool's second connection resumes the TLS session the first one was given: no certificate exchanged, so
// neither side redoes the chain parsing, verification and signature (most of a handshake's CPU). The first
// connection of a client never resumes (a new client starts with an empty cache), and a resumed connection
// carries requests like any other.
BOOST_AUTO_TEST_CASE(a_new_tls_connection_resumes_the_origin_session) {
    fixture f;
    f.start(true);
    auto c = f.client(true);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->request(get("/close"));
        BOOST_TEST(a.ok());
        BOOST_TEST(c->stats().resumed == 0u);
        auto b = co_await c->request(get("/echo"));
        BOOST_TEST_REQUIRE(b.ok());
        BOOST_TEST(b.resp.status == 200);
        BOOST_TEST(!b.reused_connection);
    });
    BOOST_TEST(c->stats().handshakes == 2u);
    BOOST_TEST(c->stats().resumed == 1u);

    auto other = f.client(true);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await other->request(get("/echo"));
        BOOST_TEST(a.ok());
    });
    BOOST_TEST(other->stats().handshakes == 1u);
    BOOST_TEST(other->stats().resumed == 0u);
}

// Answers one request per connection with a keep-alive response, then closes: a server whose idle
// timeout is shorter than ours. `closed` counts down as sockets close.
asio::awaitable<void> answer_then_close(net::tcp_acceptor* acc, latch* closed, int conns) {
    for (int i = 0; i < conns; ++i) {
        auto [ec, s] = co_await acc->async_accept();
        if (ec) co_return;
        asio::streambuf buf;
        auto [rec, n] = co_await asio::async_read_until(s, buf, "\r\n\r\n");
        if (rec) co_return;
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        auto [wec, wn] = co_await asio::async_write(s, asio::buffer(resp));
        (void)wec;
        s.close();
        closed->done();
    }
}

BOOST_AUTO_TEST_CASE(dead_idle_connection_is_not_reused) {
    fixture f;
    net::tcp_acceptor acc(f.io, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    f.port = acc.local_endpoint().port();
    latch closed(f.io, 1);
    asio::co_spawn(f.io, answer_then_close(&acc, &closed, 2), asio::detached);
    auto c = f.client(false);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->request(get("/one"));
        BOOST_TEST_REQUIRE(a.ok(), a.err.describe());
        co_await closed.wait();  // the server has closed its end
        auto b = co_await c->request(get("/two"));
        BOOST_TEST_REQUIRE(b.ok(), b.err.describe());
        BOOST_TEST(b.resp.body == "ok");
        BOOST_TEST(!b.reused_connection);
    });
    BOOST_TEST(c->stats().connects == 2u);
    BOOST_TEST(c->stats().reused == 0u);
}

BOOST_AUTO_TEST_CASE(https_without_tls_context_is_refused) {
    asio::io_context io;
    auto c = http::client::create(io.get_executor(), "https://127.0.0.1:1", {}, cg::logger());
    BOOST_TEST(!c.has_value());
}

BOOST_AUTO_TEST_SUITE_END()
