// app::start_pool and app::migrate_if_requested as a long-running subcommand uses them: the pool's
// readiness on /readyz and its metrics on /metrics over a real socket, --migrate applied before serving,
// and SIGTERM-style shutdown closing the pool within the drain.
#define BOOST_TEST_MODULE app_pg_wiring
#define BOOST_TEST_NO_MAIN
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <thread>

#include "app/pg_flags.hpp"
#include "integration/pg/support.hpp"
#include "support/pg_main.hpp"
#include "support/prom_text.hpp"
#include "support/raw_http.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

struct outcome {
    bool migrated = false;
    std::string error;
};

asio::awaitable<void> migrate_then_mark(std::shared_ptr<pg::pool> p, app::pg_flags f, logger log,
                                        outcome* out) {
    auto ms = app::load_migrations(f);
    if (!ms) {
        out->error = ms.err().describe();
        co_return;
    }
    auto r = co_await app::migrate_if_requested(*p, f, *ms, log);
    if (!r) out->error = r.err().describe();
    out->migrated = r.has_value();
}

// Polls `path` until it answers `status` (the pool connects in the background), at most 10 s.
int wait_for_status(unsigned short port, const std::string& path, int status) {
    int got = 0;
    auto until = std::chrono::steady_clock::now() + 10s;
    while (got != status && std::chrono::steady_clock::now() < until) {
        got = test::http_get(port, path).status;
        if (got != status) std::this_thread::sleep_for(20ms);  // the test thread, never the loop under test
    }
    return got;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pool_readiness_metrics_migrate_and_shutdown) {
    test::scratch_db db("app_wiring");
    auto sink = std::make_shared<memory_sink>();
    app::runtime_options o;
    o.health_listen = {"127.0.0.1", 0};
    o.handle_signals = false;
    o.shutdown_timeout = 5s;
    app::runtime rt(o, logger(sink, log_level::info));
    app::pg_flags f;
    f.dsn = "dbname=" + db.name;
    f.migrate = true;
    f.pool_size = 2;
    auto pool = app::start_pool(rt, f);
    outcome out;
    asio::co_spawn(rt.io(), migrate_then_mark(pool, f, rt.log(), &out), asio::detached);
    auto ep = rt.start();
    BOOST_REQUIRE(ep.has_value());
    std::thread loop([&rt] { rt.run(); });

    BOOST_TEST(wait_for_status(ep->port(), "/readyz", 200) == 200);
    auto ready = test::http_get(ep->port(), "/readyz");
    BOOST_TEST(ready.body.find("ok postgres") != std::string::npos, ready.body);
    auto fams = test::parse_prometheus(test::http_get(ep->port(), "/metrics").body);
    BOOST_REQUIRE(fams.count("chargeguard_pg_pool_size"));
    BOOST_TEST(fams["chargeguard_pg_pool_size"].samples.at(0).value == 2);
    BOOST_TEST(fams.count("chargeguard_pg_query_duration_seconds") == 1u);

    // --migrate applied the schema on the pool before anything else ran.
    auto until = std::chrono::steady_clock::now() + 10s;
    while (!out.migrated && out.error.empty() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(20ms);
    BOOST_TEST(out.error == "");
    BOOST_TEST(out.migrated);

    asio::post(rt.io(), [&rt] { rt.request_stop("test over"); });
    loop.join();
    BOOST_TEST(sink->contains("\"clean\":true"));  // the pool closed within the drain
    // The tables exist in the scratch database (checked with a separate, synchronous admin connection).
    BOOST_CHECK_NO_THROW(test::admin_exec("SELECT count(*) FROM billing_records", db.name));
}

BOOST_AUTO_TEST_CASE(readiness_fails_with_the_cause_while_postgres_is_unreachable) {
    app::runtime_options o;
    o.health_listen = {"127.0.0.1", 0};
    o.handle_signals = false;
    o.shutdown_timeout = 5s;
    app::runtime rt(o, logger());
    app::pg_flags f;
    f.dsn = "host=127.0.0.1 port=1 connect_timeout=1";  // nothing listens on port 1
    auto pool = app::start_pool(rt, f);
    auto ep = rt.start();
    BOOST_REQUIRE(ep.has_value());
    std::thread loop([&rt] { rt.run(); });
    auto r = test::http_get(ep->port(), "/readyz");
    int tries = 0;
    while (r.body.find("FAIL postgres") == std::string::npos && ++tries < 200) {
        std::this_thread::sleep_for(20ms);
        r = test::http_get(ep->port(), "/readyz");
    }
    BOOST_TEST(r.status == 503);
    BOOST_TEST(r.body.find("FAIL postgres") != std::string::npos, r.body);
    asio::post(rt.io(), [&rt] { rt.request_stop("test over"); });
    loop.join();
}
