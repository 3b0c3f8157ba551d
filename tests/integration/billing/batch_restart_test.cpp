// A ledger batch cut by a PostgreSQL restart (CHARGEGUARD_TEST_PG_CTL): every caller in it fails with the
// connection's error (to be requeued), none of its rows is written, and the same callers succeed once the
// server is back. Restarts the shared server: run alone (is_parallel false).
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#define BOOST_TEST_MODULE billing_batch_restart
#define BOOST_TEST_NO_MAIN
#include <asio/use_awaitable.hpp>
#include <cstdlib>

#include "batch_support.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "support/pg_main.hpp"
#include "support/pg_server_ctl.hpp"

using namespace std::chrono_literals;
using namespace cg;
using namespace cg::test::batch;

namespace {

struct server_ctl : test::pg_server_ctl {
    server_ctl() : pg_server_ctl("restart the server") {}
};

using test::run_ctl;

// Lets the plug go once the six callers queued behind it, then, once their batch's insert waits on the
// blocker's row lock (seen in pg_stat_activity from another connection), restarts the server.
net::awaitable<void> release_then_restart(fixture* f, billing::ledger* l, pg::pooled_connection* holder,
                                          const server_ctl* srv, int* rc) {
    co_await release_when_queued(l, false, 6, holder);
    auto deadline = std::chrono::steady_clock::now() + 15s;
    bool waiting = false;
    while (!waiting && std::chrono::steady_clock::now() < deadline) {
        auto r = co_await f->query(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%unnest%'",
            pg::params());
        waiting = r && (*r)[0].get<std::int64_t>(0) > 0;
        if (!waiting) co_await net::sleep_for(5ms);
    }
    BOOST_TEST(waiting);
    *rc = co_await net::offload(f->pool.get_executor(), run_ctl(srv, "restart"));
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_batch_cut_by_a_server_restart_fails_every_caller_and_a_retry_succeeds) {
    server_ctl srv;
    fixture f;
    billing::ledger l(f.pg, one_slot());
    std::vector<billing::new_record> recs;
    std::vector<std::string> keys;
    for (int i = 0; i < 6; ++i) {
        recs.push_back(
            record_for("restart-" + std::to_string(i), "2026-11", 300 + i, "r0" + std::to_string(i)));
        keys.push_back(recs.back().key);
    }
    // Another transaction inserts key 2 and stays open: the batch's insert waits on it, in flight, when the
    // server restarts.
    auto blocker = hold_row(f, hold_insert, keys[2]);
    auto plug = record_for("restart-plug", "2026-11", 99, "r0p");
    auto holder = hold_row(f, hold_insert, plug.key);
    std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> ops;
    ops.push_back([&l, plug]() { return l.preflight(plug, 30s); });
    for (auto& r : recs) ops.push_back([&l, r]() { return l.preflight(r, 30s); });
    int rc = -1;
    auto failed = run_all<result<billing::preflight_result>>(
        f, std::move(ops), [&]() { return release_then_restart(&f, &l, &holder, &srv, &rc); });
    BOOST_TEST_REQUIRE(rc == 0);
    blocker.discard();
    BOOST_TEST_REQUIRE(failed[0].has_value(), (failed[0] ? "" : failed[0].err().describe()));
    failed.erase(failed.begin());
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);  // the plug, then the six together
    std::error_code code = failed[0].code();
    for (auto& one : failed) {
        BOOST_TEST_REQUIRE(!one.has_value());
        BOOST_TEST((one.code() == code), one.err().describe());
        BOOST_TEST(pg::is_transient(one.code()), one.err().describe());
    }
    // Nothing of the cut batch was written (the blocker's row went with its transaction).
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE customer_id LIKE 'restart-_'") == 0);

    // The same callers again: every one gets its row.
    std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> again_ops;
    for (auto& r : recs) again_ops.push_back([&l, r]() { return l.preflight(r, 30s); });
    auto again = run_all<result<billing::preflight_result>>(f, std::move(again_ops));
    for (std::size_t i = 0; i < again.size(); ++i) {
        BOOST_TEST_REQUIRE(again[i].has_value(), (again[i] ? "" : again[i].err().describe()));
        BOOST_TEST(again[i]->inserted);
        BOOST_TEST(again[i]->record.key == keys[i]);
        BOOST_TEST(again[i]->record.lease_epoch == 1);
    }
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE customer_id LIKE 'restart-_'") == 6);
}
