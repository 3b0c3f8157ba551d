// PostgreSQL failing in the ways a partition or a stalled host makes it fail, against the real server:
//  * a lease renewal the client abandoned (its backend stalled) must never take effect afterwards;
//  * a caller that must not give up (settling a charge) gets a fresh connect on demand while the pool is
//    still backing off after an outage, bounded by its deadline;
//  * cancel requests stuck on an unreachable postmaster never pin the shared offload pool;
//  * a commit whose wait for the synchronous standby was cancelled is never reported as success.
// They stop and SIGSTOP the shared server, so the executable runs alone (meson is_parallel: false).
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <boost/test/unit_test.hpp>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "helpers.hpp"
#include "net/boxed.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "pg/cancel.hpp"
#include "pg/migrations.hpp"
#include "pg/pipeline.hpp"
#include "support.hpp"
#include "support/pg_server_ctl.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;
using sclock = std::chrono::steady_clock;

namespace {

double seconds_since(sclock::time_point t) {
    return std::chrono::duration<double>(sclock::now() - t).count();
}

// SIGSTOPs a server process and SIGCONTs it when destroyed (also when a check throws), or after `limit` at
// the latest, from a watchdog thread: a test that hangs (the code under test blocking the loop) must never
// leave the shared server stopped.
struct stopped_process {
    std::mutex mu;
    std::condition_variable cv;
    pid_t pid;
    std::thread watchdog;

    stopped_process(pid_t p, std::chrono::seconds limit) : pid(p) {
        BOOST_TEST_REQUIRE(pid > 0);
        BOOST_TEST_REQUIRE(::kill(pid, SIGSTOP) == 0);
        watchdog = std::thread([this, limit] {
            std::unique_lock lock(mu);
            if (!cv.wait_for(lock, limit, [this] { return pid == 0; })) resume_locked();
        });
    }
    void resume_locked() {
        if (pid > 0) ::kill(pid, SIGCONT);
        pid = 0;
    }
    void resume() {
        {
            std::lock_guard lock(mu);
            resume_locked();
        }
        cv.notify_all();
    }
    ~stopped_process() {
        resume();
        watchdog.join();
    }
};

struct server_ctl : test::pg_server_ctl {
    server_ctl() : pg_server_ctl("stop and start the server") {}
    pid_t postmaster() const {
        std::ifstream f(dir + "/data/postmaster.pid");
        long pid = 0;
        f >> pid;
        return static_cast<pid_t>(pid);
    }
};

using test::run_ctl;

// Polls `cond` on timers (never blocking the loop) until it holds or `limit` passes.
template <typename Cond>
net::awaitable<bool> eventually(Cond cond, sclock::duration limit) {
    auto until = sclock::now() + limit;
    while (!(co_await cond())) {
        if (sclock::now() > until) co_return false;
        co_await net::sleep_for(20ms);
    }
    co_return true;
}

net::awaitable<result<void>> migrate_db(std::shared_ptr<pg::pool> p) {
    auto c = co_await p->acquire();
    if (!c) co_return c.err();
    auto ms = pg::embedded_migrations();
    if (!ms) co_return ms.err();
    auto r = co_await pg::migrate(**c, *ms, {}, logger());
    if (!r) co_return r.err();
    co_return result<void>{};
}

std::string key_for(const std::string& customer) {
    return billing::base_key("faults", customer, "2026-11");
}

billing::new_record record_for(const std::string& customer) {
    billing::new_record rec;
    rec.key = key_for(customer);
    rec.event = {customer, "2026-11", 1200, "usd", "cus_ok", ""};
    rec.nsq_message_id = "0123456789abcdef";
    rec.nsq_attempts = 1;
    return rec;
}

// The row's lease: its epoch (the token) and its expiry.
net::awaitable<std::pair<billing::lease_token, std::optional<pg::timestamp>>> lease_of(
    std::shared_ptr<pg::pool> p, std::string key) {
    auto c = must(co_await p->acquire(), "acquire");
    auto r =
        must(co_await c->query("SELECT lease_epoch, lease_until FROM billing_records WHERE key = $1", key),
             "lease");
    co_return std::pair(r[0].get<std::int64_t>(0), r[0].get<std::optional<pg::timestamp>>(1));
}

// ---- 1. an abandoned lease renewal never lands ---------------------------------------------------------

net::awaitable<void> abandoned_renewal(pg_fixture& f, const cg::test::scratch_db& db) {
    pg::pool_options o;
    o.server = db.config();
    o.size = 1;  // the renewal must run on the backend we stall
    o.conn.query_timeout = 400ms;
    o.conn.cancel_grace = 300ms;
    auto pool = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
    must(co_await migrate_db(pool), "migrate");
    auto admin = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
    billing::ledger ledger(pool);

    auto pf = must(co_await ledger.preflight(record_for("abandon"), 60s), "preflight");
    BOOST_TEST_REQUIRE(pf.inserted);
    auto token = pf.record.lease_epoch;
    // A normal renewal works and moves the lease (the statement is right; only its timing is under test).
    auto renewed = must(co_await ledger.renew_lease(key_for("abandon"), token, 60s), "renew");
    BOOST_TEST_REQUIRE(renewed.has_value());
    BOOST_TEST_REQUIRE((*renewed > token));
    token = *renewed;
    auto until = (co_await lease_of(pool, key_for("abandon"))).second;

    int pid = 0;
    {
        auto c = must(co_await pool->acquire(), "acquire");
        pid = c->backend_pid();
    }
    BOOST_TEST_REQUIRE(pid > 0);
    {
        // The backend stalls with the renewal in its socket buffer; the client times out, cancels, gives up.
        stopped_process stall(pid, 10s);
        auto began = sclock::now();
        auto r = co_await ledger.renew_lease(key_for("abandon"), token, 60s);
        BOOST_TEST_REQUIRE(!r.has_value(), "the renewal cannot have succeeded on a stopped backend");
        BOOST_TEST_MESSAGE("renewal abandoned after " << seconds_since(began)
                                                      << " s: " << r.err().describe());
        // The backend wakes up later and reads the statement the client abandoned.
        co_await net::sleep_for(300ms);
        stall.resume();
    }
    // Wait until that backend has gone (it reads the statement, then finds its client gone).
    bool gone = co_await eventually(
        [&]() -> net::awaitable<bool> {
            auto c = co_await admin->acquire();
            if (!c) co_return false;
            auto r = co_await (*c)->query("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid);
            co_return r && (*r)[0].get<std::int64_t>(0) == 0;
        },
        15s);
    BOOST_TEST(gone, "the stalled backend should have ended after its client left");
    auto [epoch, lease] = co_await lease_of(admin, key_for("abandon"));
    BOOST_TEST_REQUIRE(lease.has_value());
    BOOST_TEST_REQUIRE(until.has_value());
    BOOST_TEST((epoch == token), "the abandoned renewal must not have moved the lease (its epoch moved by "
                                     << epoch - token << ")");
    BOOST_TEST((*lease == *until),
               "the abandoned renewal must not have moved the lease (it moved by "
                   << std::chrono::duration_cast<std::chrono::milliseconds>(*lease - *until).count()
                   << " ms)");
    // The lease is still ours to renew: nothing else happened to the row.
    auto again = must(co_await ledger.renew_lease(key_for("abandon"), token, 60s), "renew after");
    BOOST_TEST(again.has_value());
    co_await pool->close();
    co_await admin->close();
}

BOOST_AUTO_TEST_CASE(abandoned_lease_renewal_never_takes_effect) {
    pg_fixture f;
    cg::test::scratch_db db("abandon");
    cg::test::run_async(
        f.io, [&] { return abandoned_renewal(f, db); }, 60s);
}

// ---- 2. on-demand connects while the pool backs off ---------------------------------------------------

net::awaitable<void> settle_after_outage(pg_fixture& f, const cg::test::scratch_db& db,
                                         const server_ctl& srv) {
    pg::pool_options o;
    o.server = db.config();
    o.size = 2;
    o.acquire_timeout = 500ms;
    o.server_wait = 10s;
    // A long backoff: after one failed connect the pool believes PostgreSQL is down for 20 s.
    o.backoff_initial = 20s;
    o.backoff_max = 20s;
    auto pool = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
    pool->start();
    must(co_await migrate_db(pool), "migrate");
    billing::ledger ledger(pool);
    auto pf = must(co_await ledger.preflight(record_for("settle"), 60s), "preflight");
    BOOST_TEST_REQUIRE(pf.inserted);

    // Stop the server (on a thread: pg_ctl waits), and make the pool see it: it is now down, backing off.
    BOOST_TEST_REQUIRE(co_await net::offload(f.offload.get_executor(), run_ctl(&srv, "stop")) == 0);
    auto down = co_await pool->acquire();
    BOOST_TEST_REQUIRE(!down.has_value());
    BOOST_TEST_REQUIRE(!pool->state().up);

    // While it is down: a bounded waiter gives up at its deadline, not at once and not much later.
    auto began = sclock::now();
    auto bounded = co_await pool->acquire_until(pg::acquire_mode::wait_for_server, sclock::now() + 1500ms);
    double waited = seconds_since(began);
    BOOST_TEST(!bounded.has_value());
    BOOST_TEST(waited >= 1.4, "gave up after " << waited << " s, before its deadline");
    BOOST_TEST(waited < 3.0, "gave up after " << waited << " s, long after its deadline");
    if (!bounded) BOOST_TEST_MESSAGE("bounded wait: " << bounded.err().describe());

    // The server comes back; the pool's backoff still says "down" for ~20 s.
    BOOST_TEST_REQUIRE(co_await net::offload(f.offload.get_executor(), run_ctl(&srv, "start")) == 0);
    auto stale = co_await pool->acquire();
    BOOST_TEST(!stale.has_value(), "fail_fast still trusts the backoff (the stale state this test is about)");

    // Settling after a successful charge: connects at once instead of failing on the stale state.
    began = sclock::now();
    auto m = co_await ledger.mark_charged(key_for("settle"), "ch_after_outage");
    BOOST_TEST_REQUIRE(m.has_value(), (m ? "" : m.err().describe()));
    BOOST_TEST(*m);
    BOOST_TEST(seconds_since(began) < 5.0);
    BOOST_TEST(pool->state().up);

    // And a waiter that starts while the server is down gets a connection as soon as it is back.
    BOOST_TEST_REQUIRE(co_await net::offload(f.offload.get_executor(), run_ctl(&srv, "stop")) == 0);
    std::thread starter([&srv] {
        std::this_thread::sleep_for(1s);  // a thread of the test, not the loop
        srv.run("start");
    });
    began = sclock::now();
    auto back = co_await pool->acquire_until(pg::acquire_mode::wait_for_server, sclock::now() + 20s);
    waited = seconds_since(began);
    starter.join();
    BOOST_TEST_REQUIRE(back.has_value(), (back ? "" : back.err().describe()));
    auto one = co_await (*back)->query("SELECT 1");
    BOOST_TEST(one.has_value());
    BOOST_TEST(waited < 10.0, "connected " << waited << " s after asking (the backoff would have said 20 s)");
    back->release();
    co_await pool->close();
}

BOOST_AUTO_TEST_CASE(settling_connects_on_demand_while_the_pool_backs_off) {
    server_ctl srv;
    pg_fixture f;
    cg::test::scratch_db db("ondemand");
    try {
        cg::test::run_async(
            f.io, [&] { return settle_after_outage(f, db, srv); }, 90s);
    } catch (...) {
        srv.run("start");  // leave the server running for whatever runs next
        throw;
    }
    srv.run("start");
}

// ---- 3. hung cancels do not starve the offload pool -----------------------------------------------------

// Like the Stripe client's work on the offload pool: a chain of timers (request and retry deadlines).
net::awaitable<int> offload_timers() {
    for (int i = 0; i < 5; ++i) co_await net::sleep_for(100ms);
    co_return 5;
}

net::awaitable<result<pg::rows>> sleep_query(std::shared_ptr<pg::connection> c) {
    co_return co_await c->query("SELECT pg_sleep(5)");
}

net::awaitable<void> cancels_off_the_offload_pool(pg_fixture& f, const server_ctl& srv) {
    pg::connection_options co;
    co.query_timeout = 300ms;
    co.cancel_grace = 300ms;
    auto cfg = cg::test::server_config();
    std::vector<std::shared_ptr<pg::connection>> conns;
    for (int i = 0; i < 2; ++i)
        conns.push_back(must(co_await pg::connection::connect(cfg, f.offload.get_executor(), co), "connect"));
    auto before = pg::cancels_in_flight();

    // The postmaster stops answering: a cancel request now connects (the kernel accepts into the backlog)
    // and then waits forever for the postmaster to close it.
    stopped_process stall(srv.postmaster(), 8s);
    std::vector<std::optional<result<pg::rows>>> out(conns.size());
    int finished = 0;
    for (std::size_t i = 0; i < conns.size(); ++i)
        asio::co_spawn(f.io, net::boxed(sleep_query(conns[i])),
                       [&out, &finished, i](std::exception_ptr e, std::optional<result<pg::rows>> r) {
                           if (e) std::rethrow_exception(e);
                           out[i] = std::move(r);
                           ++finished;
                       });
    // Both queries time out and send their cancels (the shared pool has exactly two threads).
    co_await eventually([&]() -> net::awaitable<bool> { co_return pg::cancels_in_flight() >= before + 2; },
                        5s);
    BOOST_TEST(pg::cancels_in_flight() >= before + 2,
               "both cancel requests should be stuck on the postmaster");

    auto began = sclock::now();
    auto work = co_await net::with_timeout(net::offload(f.offload.get_executor(), offload_timers()), 3s);
    double took = seconds_since(began);
    BOOST_TEST(work.has_value(), "offload work did not finish within 3 s while cancels were stuck");
    BOOST_TEST(took < 1.5, "offload work took " << took << " s (0.5 s of timers)");
    BOOST_TEST_MESSAGE("offload work with two stuck cancels: " << took << " s");

    co_await eventually([&]() -> net::awaitable<bool> { co_return finished == 2; }, 5s);
    BOOST_TEST_REQUIRE(finished == 2);
    for (auto& r : out) {
        BOOST_TEST_REQUIRE(r.has_value());
        BOOST_TEST(!r->has_value());
        if (!r->has_value()) BOOST_TEST((r->code() == pg::errc::timeout), r->err().describe());
    }
    for (auto& c : conns) BOOST_TEST(c->broken());

    stall.resume();
    bool drained = co_await eventually(
        [&]() -> net::awaitable<bool> { co_return pg::cancels_in_flight() == before; }, 10s);
    BOOST_TEST(drained, "the stuck cancels should finish once the postmaster runs again");
}

BOOST_AUTO_TEST_CASE(stuck_cancel_requests_do_not_starve_the_offload_pool) {
    server_ctl srv;
    pg_fixture f;
    cg::test::run_async(
        f.io, [&] { return cancels_off_the_offload_pool(f, srv); }, 60s);
}

// ---- 4. a commit the synchronous standby never confirmed is not a success ----------------------------

// A throwaway cluster of its own (ci/pg-cluster), with synchronous replication to a standby that never
// connects: every commit on it waits. Its own, so nothing else ever waits on it, even if this test dies.
struct cluster_waiting_for_a_standby : test::pg_server_ctl {
    unsigned short port = test::closed_port();
    cluster_waiting_for_a_standby() : pg_server_ctl("start a cluster of the test's own") {
        char tmpl[] = "/tmp/cg-syncrep.XXXXXX";
        BOOST_TEST_REQUIRE(::mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        ::chmod(tmpl, 0755);
        BOOST_TEST_REQUIRE(run("start", std::to_string(port)) == 0);
        exec("CREATE TABLE t (id int PRIMARY KEY)");
        exec("ALTER SYSTEM SET synchronous_standby_names = 'cg_no_such_standby'");
        exec("SELECT pg_reload_conf()");
    }
    ~cluster_waiting_for_a_standby() {
        run("stop");
        std::system(("rm -rf \"" + dir + "\"").c_str());
    }
    int run(const std::string& what, const std::string& extra = "") const {
        return std::system(
            ("\"" + ctl + "\" " + what + " \"" + dir + "\" " + extra + " >/dev/null 2>&1").c_str());
    }
    std::string dsn() const {
        return "host=127.0.0.1 port=" + std::to_string(port) + " dbname=chargeguard_test user=postgres";
    }
    // libpq's synchronous API: for setting up and reading back, never on a loop.
    std::string exec(const std::string& sql) const {
        PGconn* c = PQconnectdb(dsn().c_str());
        PGresult* r = PQexec(c, sql.c_str());
        auto st = PQresultStatus(r);
        std::string out = st == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
        std::string err = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? "" : PQerrorMessage(c);
        PQclear(r);
        PQfinish(c);
        BOOST_TEST_REQUIRE(err.empty(), sql << ": " << err);
        return out;
    }
};

// PostgreSQL answers a cancel during a commit's wait for the standby with a WARNING and the command's
// success, the row committed on the primary only. Our deadline's cancel must turn that into an error.
net::awaitable<void> unconfirmed_commits(pg_fixture& f, const cluster_waiting_for_a_standby& srv) {
    pg::connection_options opts;
    opts.query_timeout = 300ms;
    auto cfg = test::server_config(srv.dsn());
    auto connect = [&]() -> net::awaitable<std::unique_ptr<pg::connection>> {
        co_return must(co_await pg::connection::connect(cfg, f.offload.get_executor(), opts), "connect");
    };
    // The server applies the setting a moment after the reload: until then commits do not wait, and a
    // statement succeeds honestly. Each try is a fresh id on a fresh connection (a cancelled one is dropped).
    int id = 0;
    result<pg::rows> single = error(pg::errc::protocol_error, "not run");
    auto until = sclock::now() + 15s;
    for (;;) {
        auto c = co_await connect();
        single = co_await c->query("INSERT INTO t (id) VALUES ($1)", ++id);
        if (!single || sclock::now() > until) break;
    }
    BOOST_TEST_REQUIRE(!single.has_value(), "a commit the standby never confirmed was reported as success");
    BOOST_TEST((single.code() == pg::errc::timeout), single.err().describe());
    BOOST_TEST(single.err().describe().find("synchronous standby") != std::string::npos,
               single.err().describe());

    // A pipeline batch (the ledger's group commit) too.
    auto c = co_await connect();
    pg::pipeline batch;
    batch.add("INSERT INTO t (id) VALUES ($1)", 1000);
    batch.add("INSERT INTO t (id) VALUES ($1)", 1001);
    auto many = co_await c->run(batch);
    BOOST_TEST_REQUIRE(!many.has_value(), "a batch the standby never confirmed was reported as success");
    BOOST_TEST((many.code() == pg::errc::timeout), many.err().describe());
    co_return;
}

BOOST_AUTO_TEST_CASE(commit_unconfirmed_by_the_synchronous_standby_is_an_error) {
    pg_fixture f;
    cluster_waiting_for_a_standby srv;
    cg::test::run_async(
        f.io, [&] { return unconfirmed_commits(f, srv); }, 60s);
    // What the server did with them: committed locally, which is why success would be a lie a failover
    // exposes. A read does not wait for the standby.
    BOOST_TEST(srv.exec("SELECT count(*) FROM t WHERE id >= 1000") == "2");
}

}  // namespace
