// The pool against the real server: reuse, rollback of abandoned transactions, bounded waits, failing fast
// while the server is unreachable, readiness and metrics.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "helpers.hpp"
#include "net/timeout.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;
using clock_type = std::chrono::steady_clock;

namespace {

BOOST_AUTO_TEST_SUITE(pool)

std::shared_ptr<pg::pool> make_pool(pg_fixture& f, pg::pool_options o, metrics::registry* reg = nullptr,
                                    logger log = {}) {
    return pg::pool::create(f.io.get_executor(), f.offload.get_executor(), std::move(o), std::move(log), reg);
}

pg::pool_options options(pg::config cfg, std::size_t size) {
    pg::pool_options o;
    o.server = std::move(cfg);
    o.size = size;
    return o;
}

net::awaitable<void> rollback_on_return(pg_fixture& f, std::string db) {
    auto p = make_pool(f, options(cg::test::server_config("dbname=" + db), 1));
    {
        auto c = must(co_await p->acquire(), "acquire");
        must(co_await c->execute("CREATE TABLE r (id int PRIMARY KEY)"), "create");
    }
    int pid = 0;
    {
        auto c = must(co_await p->acquire(), "acquire");
        pid = c->backend_pid();
        must(co_await c->execute("BEGIN"), "begin");
        must(co_await c->query("INSERT INTO r VALUES ($1)", 1), "insert");
        BOOST_TEST((c->transaction_status() == pg::tx_status::in_transaction));
    }                                                       // given back mid-transaction
    auto c = must(co_await p->acquire(), "acquire again");  // waits for the rollback to finish
    BOOST_TEST(c->backend_pid() == pid);                    // rolled back and reused, not dropped
    BOOST_TEST((c->transaction_status() == pg::tx_status::idle));
    auto n = must(co_await c->query("SELECT count(*) FROM r"), "count");
    BOOST_TEST(n[0].get<std::int64_t>(0) == 0);

    // A transaction in the failed state is rolled back too.
    must(co_await c->execute("BEGIN"), "begin");
    BOOST_TEST((co_await c->query("SELECT 1/0")).code() == pg::errc::data_exception);
    BOOST_TEST((c->transaction_status() == pg::tx_status::in_error));
    c.release();
    auto d = must(co_await p->acquire(), "acquire after failed txn");
    BOOST_TEST((d->transaction_status() == pg::tx_status::idle));
    BOOST_TEST(must(co_await d->query("SELECT 7"), "select")[0].get<std::int64_t>(0) == 7);
    d.release();
    co_await p->close();
}

BOOST_AUTO_TEST_CASE(connection_returned_mid_transaction_is_rolled_back) {
    pg_fixture f;
    cg::test::scratch_db db("pool");
    cg::test::run_async(f.io, [&] { return rollback_on_return(f, db.name); });
}

net::awaitable<void> release_later(pg::pooled_connection c, clock_type::duration after) {
    co_await net::sleep_for(after);
    c.release();
}

net::awaitable<void> bounded_wait(pg_fixture& f) {
    auto o = options(cg::test::server_config(), 1);
    o.acquire_timeout = 200ms;
    metrics::registry reg;
    auto p = make_pool(f, o, &reg);
    auto held = must(co_await p->acquire(), "acquire");
    int pid = held->backend_pid();
    auto t0 = clock_type::now();
    auto r = co_await p->acquire();
    auto waited = clock_type::now() - t0;
    BOOST_TEST(r.code() == pg::errc::unavailable);
    BOOST_TEST(r.err().message.find("in use") != std::string::npos, r.err().message);
    BOOST_TEST(waited >= 200ms);
    BOOST_TEST(waited < 1s);
    // A connection given back while someone waits goes straight to the waiter.
    asio::co_spawn(f.io, release_later(std::move(held), 50ms), asio::detached);
    // Success alone proves the handover: the 200 ms acquire deadline would have failed it otherwise.
    auto got = must(co_await p->acquire(), "acquire after release");
    BOOST_TEST(got->backend_pid() == pid);
    auto text = reg.render();
    BOOST_TEST(text.find("chargeguard_pg_pool_waits_total{pool=\"main\"} 2") != std::string::npos, text);
    BOOST_TEST(text.find("chargeguard_pg_pool_acquire_failures_total{pool=\"main\"} 1") != std::string::npos);
    got.release();
    co_await p->close();
}

BOOST_AUTO_TEST_CASE(bounded_wait_then_unavailable) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return bounded_wait(f); });
}

net::awaitable<void> down_fails_fast(pg_fixture& f) {
    auto port = cg::test::closed_port();
    auto o = options(cg::test::loopback_config(port), 4);
    o.backoff_initial = 2s;
    metrics::registry reg;
    metrics::health health;
    auto p = make_pool(f, o, &reg);
    p->add_readiness_check(health);
    BOOST_TEST(!health.ready().ok);  // nothing connected yet
    auto first = co_await p->acquire();
    BOOST_TEST(first.code() == pg::errc::unavailable);
    BOOST_TEST(first.err().message.find("Connection refused") != std::string::npos, first.err().message);
    // While down, callers fail at once with the cause instead of each trying (and queueing) again.
    auto t0 = clock_type::now();
    for (int i = 0; i < 100; ++i) {
        auto r = co_await p->acquire();
        BOOST_TEST(r.code() == pg::errc::unavailable);
        if (i == 0) {
            BOOST_TEST(r.err().message.find("unreachable") != std::string::npos, r.err().message);
            BOOST_TEST(r.err().message.find("Connection refused") != std::string::npos, r.err().message);
            BOOST_TEST(r.err().message.find("next connection attempt in") != std::string::npos,
                       r.err().message);
        }
    }
    BOOST_TEST((clock_type::now() - t0) < 1s);  // answered from the cached failure, inside the 2 s backoff
    auto ready = health.ready();
    BOOST_TEST(!ready.ok);
    BOOST_TEST(ready.body.find("FAIL postgres") != std::string::npos, ready.body);
    BOOST_TEST(ready.body.find("Connection refused") != std::string::npos, ready.body);
    auto text = reg.render();
    BOOST_TEST(
        text.find("chargeguard_pg_connects_total{outcome=\"failed\",pool=\"main\"} 1") != std::string::npos,
        text);
    BOOST_TEST(text.find("chargeguard_pg_up{pool=\"main\"} 0") != std::string::npos);
    co_await p->close();
}

BOOST_AUTO_TEST_CASE(fails_fast_with_the_cause_while_down) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return down_fails_fast(f); });
}

net::awaitable<void> readiness_and_metrics(pg_fixture& f) {
    metrics::registry reg;
    metrics::health health;
    auto p = make_pool(f, options(cg::test::server_config(), 2), &reg);
    p->add_readiness_check(health);
    {
        auto c = must(co_await p->acquire(), "acquire");
        BOOST_TEST(health.ready().ok, health.ready().body);
        must(co_await c->query("SELECT 1"), "select");
        BOOST_TEST((co_await c->query("SELECT 1/0")).code() == pg::errc::data_exception);
        auto text = reg.render();
        BOOST_TEST(text.find("chargeguard_pg_pool_in_use_connections{pool=\"main\"} 1") != std::string::npos,
                   text);
        BOOST_TEST(
            text.find("chargeguard_pg_query_duration_seconds_count{pool=\"main\"} 2") != std::string::npos,
            text);
        BOOST_TEST(text.find("chargeguard_pg_errors_total{class=\"data_exception\",pool=\"main\"} 1") !=
                   std::string::npos);
        BOOST_TEST(text.find("chargeguard_pg_pool_size{pool=\"main\"} 2") != std::string::npos);
    }
    auto text = reg.render();
    BOOST_TEST(text.find("chargeguard_pg_pool_in_use_connections{pool=\"main\"} 0") != std::string::npos,
               text);
    BOOST_TEST(text.find("chargeguard_pg_pool_open_connections{pool=\"main\"} 1") != std::string::npos, text);
    co_await p->close();
    BOOST_TEST(!health.ready().ok);
}

BOOST_AUTO_TEST_CASE(readiness_and_metrics_follow_the_pool) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return readiness_and_metrics(f); });
}

net::awaitable<void> dead_idle_dropped(pg_fixture& f) {
    auto sink = std::make_shared<memory_sink>();
    auto p = make_pool(f, options(cg::test::server_config(), 2), nullptr, logger(sink, log_level::info));
    int victim = 0;
    {
        auto c = must(co_await p->acquire(), "acquire");
        victim = c->backend_pid();
    }
    // Kill the idle connection's backend from another session; PostgreSQL 14+ waits until it is gone.
    auto admin =
        must(co_await pg::connection::connect(cg::test::server_config(), f.offload.get_executor()), "admin");
    auto gone = must(co_await admin->query("SELECT pg_terminate_backend($1, 10000)", victim), "terminate");
    BOOST_REQUIRE(gone[0].get<bool>(0));
    // The pool notices without a failed query: it hands out a fresh connection that works.
    auto c = must(co_await p->acquire(), "acquire after terminate");
    BOOST_TEST(c->backend_pid() != victim);
    BOOST_TEST(must(co_await c->query("SELECT 1"), "select")[0].get<std::int64_t>(0) == 1);
    // The server's last words (FATAL 57P01) were read and logged, not lost with the socket.
    BOOST_TEST(sink->contains("postgres ended the session"));
    BOOST_TEST(sink->contains("57P01"));
    c.release();
    co_await p->close();
}

BOOST_AUTO_TEST_CASE(dead_idle_connection_is_replaced) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return dead_idle_dropped(f); });
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
