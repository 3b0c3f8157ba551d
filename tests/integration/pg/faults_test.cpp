// PostgreSQL failing in the ways a partition or a stalled host makes it fail, against the real server:
//  * a lease renewal the client abandoned (its backend stalled) must never take effect afterwards;
//  * a caller that must not give up (settling a charge) gets a fresh connect on demand while the pool is
//    still backing off after an outage, bounded by its deadline;
//  * cancel requests stuck on an unreachable postmaster never pin the shared offload pool;
//  * a commit whose wait for the synchronous standby was cancelled is never reported as success.
// They stop and SIGSTOP the shared server, so the executable runs alone (meson is_parallel: false).
// The cancels and the unconfirmed commit are faults_cancel_commit_test.cpp; the shared pieces faults.hpp.
#include "faults.hpp"

#include <boost/test/unit_test.hpp>

namespace {

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

}  // namespace
