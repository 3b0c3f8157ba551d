// http::client's connection pool against the foundation's http::server (client_fixture.hpp): the limit on
// connections, growth a few connects at a time and past the eager ones against slow and saturated origins,
// and the wait for a connection counted against the request timeout.
#include <boost/test/unit_test.hpp>

#include "client_fixture.hpp"

BOOST_AUTO_TEST_SUITE(client)

BOOST_AUTO_TEST_CASE(pool_limit_bounds_connections) {
    fixture f;
    f.start(true);
    http::client_options o;
    o.max_connections = 2;
    auto c = f.client(true, o);
    auto results = burst(f.io, c.get(), "/slow?ms=30", 8);
    for (auto& r : results) {
        BOOST_TEST(r.ok(), r.err.describe());
        BOOST_TEST(r.resp.status == 200);
    }
    BOOST_TEST(f.log.hits == 8);
    BOOST_TEST(f.log.max_active == 2);
    BOOST_TEST(c->stats().connects == 2u);
    BOOST_TEST(c->stats().open == 2u);
}

// New connections are set up at most 8 at a time (a burst against a fast origin is served by the connections
// coming back instead of opening one per request), yet a slow origin still gets the whole pool: 40 requests
// that each hold their connection until all 40 are in run at once, on 40 connections. (The origin waits for
// the 40th request rather than a fixed time: on a loaded machine the last connects can take longer than
// any fixed hold, and the first answers' connections would then serve the last requests.)
BOOST_AUTO_TEST_CASE(pool_grows_to_its_limit_a_few_connects_at_a_time) {
    fixture f;
    f.start(true);
    http::client_options o;
    o.max_connections = 40;
    auto c = f.client(true, o);
    auto results = burst(f.io, c.get(), "/gather?n=40", 40);
    for (auto& r : results) BOOST_TEST(r.ok(), r.err.describe());
    BOOST_TEST(f.log.max_active == 40);
    BOOST_TEST(c->stats().connects == 40u);
}

// Past its eager size the pool grows only while the origin keeps its pace and the rate needs it. A slow but
// steady origin (every answer 300 ms) gets its connections once the first answers show that pace: 40
// requests, eager 8 — the first 8 connect at once, the other 32 wait (nothing is known of the origin yet),
// and from the first answers on the pool grows with the rate they come at (Little's law: 4 × rate ×
// 300 ms: room for the rate to grow fourfold), three more per answer, instead of queueing 5 deep behind 8.
BOOST_AUTO_TEST_CASE(pool_past_eager_grows_against_a_slow_steady_origin) {
    fixture f;
    f.start(true);
    http::client_options o;
    o.max_connections = 40;
    o.growth.eager = 8;
    auto c = f.client(true, o);
    auto results = burst(f.io, c.get(), "/slow?ms=300", 40);
    for (auto& r : results) BOOST_TEST(r.ok(), r.err.describe());
    // (not counted as held: the 8 connects under way were the limit when they queued)
    BOOST_TEST(c->stats().connects >= 14u);
    BOOST_TEST(f.log.max_active >= 14);
}

// A saturated origin (one request at a time, 20 ms each: answers take 20, 40, 60 ms … as requests pile up)
// does not get a connection per request: past the eager size the pool holds once answers slow to over
// twice the fastest, and the requests wait for connections to come back (all still succeed). Without the
// rule the pool holds none back and opens far more than the rule allows.
BOOST_AUTO_TEST_CASE(pool_past_eager_holds_against_a_saturated_origin) {
    for (bool rule : {true, false}) {
        fixture f;
        f.start(true);
        http::client_options o;
        o.max_connections = 40;
        if (rule) o.growth.eager = 4;
        auto c = f.client(true, o);
        auto results = burst(f.io, c.get(), "/queue?ms=20", 40);
        for (auto& r : results) BOOST_TEST(r.ok(), r.err.describe());
        BOOST_TEST(f.log.hits == 40);
        if (rule) {
            // The 4 eager ones: Little's law wants at most 4 × 50 answers/s × 20 ms = 4 connections, and the
            // answers slowed past 2 × 20 ms + 1 ms at the third. 6 on a quiet machine; the rule judges the
            // answers' times as measured, which under ASan on a loaded machine include our own delays (13
            // there). That requests waited for connections to come back is the rule; the count only has to
            // stay well below one per request.
            BOOST_TEST(c->stats().held >= 30u);
            BOOST_TEST(c->stats().connects <= 20u);
        } else {
            // Never held: every request that found no idle connection opened one. How many found one back
            // depends on how fast the connects go beside the answers (≥ 30 on a quiet machine, 27 under
            // ASan beside other builds).
            BOOST_TEST(c->stats().held == 0u);
            BOOST_TEST(c->stats().connects > 12u);
        }
    }
}

BOOST_AUTO_TEST_CASE(pool_wait_counts_against_the_request_timeout) {
    fixture f;
    f.start(false);
    http::client_options o;
    o.max_connections = 1;
    o.request_timeout = 1000ms;
    auto c = f.client(false, o);
    std::vector<http::client_result> results(2);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        latch l(f.io, 2);
        asio::co_spawn(f.io, get_into(c.get(), "/slow?ms=600", &results[0], &l), asio::detached);
        asio::co_spawn(f.io, get_into(c.get(), "/slow?ms=600", &results[1], &l), asio::detached);
        co_await l.wait();
    });
    // The first one fits; the second waits ~600 ms for the connection and then needs 600 ms more.
    BOOST_TEST(results[0].ok());
    BOOST_TEST_REQUIRE(!results[1].ok());
    BOOST_TEST(results[1].err.code == make_error_code(http::errc::timeout));
    BOOST_TEST(c->stats().open <= 1u);
}

BOOST_AUTO_TEST_SUITE_END()
