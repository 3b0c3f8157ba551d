// The server last seen as the primary, kept in the database (pool_options::failover_record, migration 0024),
// on the one test server: a pool that connected before the migrations created the record writes it at its
// maintenance; a pool started later whose record names another timeline (as one a sidecar left before a
// promotion) or another cluster reports a failover at its first connection, once, and records the server it
// reached; one whose record matches reports none.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;

namespace {

struct watched {
    metrics::registry reg;
    std::vector<pg::failover_event> seen;
    std::shared_ptr<pg::pool> pool;
};

std::unique_ptr<watched> watching_pool(pg_fixture& f, const cg::test::scratch_db& db) {
    auto w = std::make_unique<watched>();
    pg::pool_options o;
    o.server = db.config();
    o.size = 2;
    o.health_interval = 200ms;
    o.watch_failover = true;
    o.failover_record = "ns";
    w->pool =
        pg::pool::create(f.io.get_executor(), f.offload.get_executor(), std::move(o), logger(), &w->reg);
    w->pool->on_failover([raw = w.get()](const pg::failover_event& e) { raw->seen.push_back(e); });
    w->pool->start();
    return w;
}

// One statement through `w`'s pool (a first connection, compared with the record), then the record as it
// stands once the pool has written it (or "" after 5 s).
const std::string one = "SELECT 1";

net::awaitable<std::string> touch_and_read(watched& w) {
    static const std::string read =
        "SELECT system_identifier || '/' || timeline FROM pg_server_seen WHERE name = 'ns'";
    must(co_await pg::exec_pooled(w.pool, one, pg::params()), "first statement");
    for (int i = 0; i < 100; ++i) {
        auto r = co_await pg::exec_pooled(w.pool, read, pg::params());
        if (r && r->size() == 1 && w.pool->server() && !w.pool->server()->system_identifier.empty()) {
            const auto id =
                w.pool->server()->system_identifier + "/" + std::to_string(w.pool->server()->timeline);
            if (r->get<std::string>(0, 0) == id) co_return id;
        }
        co_await net::sleep_for(50ms);
    }
    co_return std::string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(failover_record)

BOOST_AUTO_TEST_CASE(a_pool_started_after_another_server_was_recorded_reports_the_failover_once) {
    pg_fixture f;
    cg::test::scratch_db db("fo_rec");
    const auto ms = must(pg::embedded_migrations(), "embedded");
    auto exec = [&](const std::string& sql) {
        cg::test::run_async(f.io, [&]() -> net::awaitable<void> {
            auto c = must(co_await pg::connection::connect(db.config(), f.offload.get_executor()), "connect");
            must(co_await c->query(sql), "statement");
        });
    };

    // Connected before the table exists: nothing to compare with, recorded once the migrations made it.
    auto first = watching_pool(f, db);
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> {
        must(co_await pg::exec_pooled(first->pool, one, pg::params()), "before the migrations");
        auto c = must(co_await pg::connection::connect(db.config(), f.offload.get_executor()), "connect");
        must(co_await pg::migrate(*c, ms, {}, logger()), "migrate");
    });
    std::string recorded;
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> { recorded = co_await touch_and_read(*first); });
    BOOST_TEST_REQUIRE(!recorded.empty(), "the pool did not record the server once the table existed");
    BOOST_TEST(first->seen.empty());
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> { co_await first->pool->close(); });

    // The same server recorded: a later pool reports nothing.
    auto same = watching_pool(f, db);
    cg::test::run_async(
        f.io, [&]() -> net::awaitable<void> { BOOST_TEST(co_await touch_and_read(*same) == recorded); });
    BOOST_TEST(same->seen.empty());
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> { co_await same->pool->close(); });

    // The record a sidecar left on the primary before a promotion: the timeline it wrote on.
    exec("UPDATE pg_server_seen SET timeline = timeline + 7 WHERE name = 'ns'");
    auto promoted = watching_pool(f, db);
    cg::test::run_async(
        f.io, [&]() -> net::awaitable<void> { BOOST_TEST(co_await touch_and_read(*promoted) == recorded); });
    BOOST_TEST_REQUIRE(promoted->seen.size() == 1u);
    BOOST_TEST(promoted->seen[0].cause.find("a new WAL timeline") != std::string::npos,
               promoted->seen[0].cause);
    BOOST_TEST(promoted->seen[0].cause.find("since the server recorded last") != std::string::npos);
    BOOST_TEST(promoted->seen[0].before.timeline == promoted->seen[0].now.timeline + 7);
    // Its other connections compare with what it recorded: no second report.
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> {
        auto a = must(co_await promoted->pool->acquire(), "one");
        auto b = must(co_await promoted->pool->acquire(), "two");
        (void)a;
        (void)b;
    });
    BOOST_TEST(promoted->seen.size() == 1u);
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> { co_await promoted->pool->close(); });

    // Another cluster altogether.
    exec("UPDATE pg_server_seen SET system_identifier = '1' WHERE name = 'ns'");
    auto other = watching_pool(f, db);
    cg::test::run_async(
        f.io, [&]() -> net::awaitable<void> { BOOST_TEST(co_await touch_and_read(*other) == recorded); });
    BOOST_TEST_REQUIRE(other->seen.size() == 1u);
    BOOST_TEST(other->seen[0].cause.find("another cluster") != std::string::npos, other->seen[0].cause);
    cg::test::run_async(f.io, [&]() -> net::awaitable<void> { co_await other->pool->close(); });
}

BOOST_AUTO_TEST_SUITE_END()
