// Group commit of the pre-flight against the real server, with another transaction on the same rows: a row
// already in the ledger is read by the batch's statement without waiting for a writer of it, and a row
// committed while the statement waits is read by the statement that follows, as after a single insert.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "batch_support.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::event_json;

namespace {

using namespace cg::test::batch;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_ledger_batch)

namespace {

// Another transaction, left open: `sql` ($1: the key) inside BEGIN.
pg::pooled_connection open_transaction(fixture& f, const std::string& sql, const std::string& key) {
    return hold_row(f, sql, key);
}

void end_transaction(fixture& f, pg::pooled_connection& c, const char* how) {
    auto r = f.run([](pg::pooled_connection* c, std::string how) -> net::awaitable<result<void>> {
        co_return co_await (*c)->execute(how);
    }(&c, how));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    c.release();
}

// Polls (bounded) until a statement of this database waits for a lock another transaction holds.
net::awaitable<bool> until_a_statement_waits(fixture* f) {
    net::steady_timer t(co_await asio::this_coro::executor);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
        auto r = co_await f->query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = "
            "'Lock'",
            pg::params());
        if (r && (*r)[0].get<std::int64_t>(0) > 0) co_return true;
        t.expires_after(2ms);
        co_await t.async_wait();
    }
    co_return false;
}

// Lets the plug's batch go (release_when_queued), then commits `other` once the next batch's statement waits
// for it.
net::awaitable<void> commit_once_the_batch_waits(fixture* f, billing::ledger* l, std::size_t n,
                                                 pg::pooled_connection* holder,
                                                 pg::pooled_connection* other) {
    co_await release_when_queued(l, false, n, holder);
    const bool waits = co_await until_a_statement_waits(f);
    BOOST_TEST(waits);
    auto r = co_await (*other)->execute("COMMIT");
    BOOST_TEST(r.has_value());
    other->release();
}

}  // namespace

// Rows already in the ledger (a replayed run) are answered by the batch's one statement from what it reads,
// without an insert: so a replayed delivery does not wait behind another transaction updating its row (an
// insert that conflicts with a row being updated waits for the update to end; here past the pool's
// statement timeout).
BOOST_AUTO_TEST_CASE(rows_already_in_the_ledger_are_read_without_waiting_for_a_writer_of_them) {
    fixture f;
    pg::pool_options po;
    po.server = f.db.config();
    po.size = 4;
    po.conn.query_timeout = 1500ms;
    po.conn.cancel_grace = 1s;
    auto short_pool = pg::pool::create(f.io.get_executor(), f.pool.get_executor(), po, logger());
    billing::ledger single(f.pg, unbatched());
    billing::ledger l(short_pool, one_slot());

    auto [recs, keys] = records_for("replayed-", 4, 600, "r0");
    for (int i = 0; i < 3; ++i) {
        auto first = f.run(single.preflight(recs[i], 30s));
        BOOST_TEST_REQUIRE((first.has_value() && first->inserted));
        auto settled = f.run(single.mark_charged(keys[i], "ch_replayed_" + std::to_string(i)));
        BOOST_TEST_REQUIRE((settled.has_value() && *settled));
    }
    // Another transaction updates row 1 and stays open.
    auto writer = open_transaction(
        f, "UPDATE billing_records SET last_error = 'being written' WHERE key = $1", keys[1]);

    std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> ops;
    auto plug = record_for("replayed-plug", "2026-11", 99, "r0p");
    auto holder = hold_row(f, hold_insert, plug.key);
    ops.push_back([&l, plug]() { return l.preflight(plug, 30s); });
    for (auto& r : recs) ops.push_back([&l, r]() { return l.preflight(r, 30s); });
    auto out = run_all<result<billing::preflight_result>>(
        f, std::move(ops), [&]() { return release_when_queued(&l, false, recs.size(), &holder); });
    out.erase(out.begin());
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);  // the plug, then the four together
    for (auto& o : out) BOOST_TEST_REQUIRE(o.has_value(), (o ? "" : o.err().describe()));
    for (int i = 0; i < 3; ++i) {
        BOOST_TEST(!out[i]->inserted);
        BOOST_TEST(out[i]->record.key == keys[i]);
        BOOST_TEST((out[i]->record.status == billing::record_status::charged));
        BOOST_TEST(
            (out[i]->record.charge_id == std::optional<std::string>("ch_replayed_" + std::to_string(i))));
    }
    BOOST_TEST(out[3]->inserted);  // the fresh one in the same statement
    BOOST_TEST(out[3]->record.key == keys[3]);
    BOOST_TEST(out[3]->record.lease_epoch == 1);
    BOOST_TEST((out[3]->record.lease_remaining == std::optional<std::chrono::milliseconds>(30s)));
    end_transaction(f, writer, "ROLLBACK");
    BOOST_TEST(count_leased(f, {keys[3]}) == 1);
    f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<bool> {
        co_await p->close();
        co_return true;
    }(short_pool));
}

// A row another transaction inserts while the batch's statement runs — invisible to the statement's snapshot,
// its insert waiting for that transaction, which then commits — is neither read nor inserted by the
// statement: its caller gets the committed row from the read that follows, exactly as after a single insert;
// the rest of the batch is inserted.
BOOST_AUTO_TEST_CASE(a_row_committed_while_the_batch_waits_on_it_is_read_after_the_statement) {
    fixture f;
    billing::ledger l(f.pg, one_slot());
    auto [recs, keys] = records_for("meanwhile-", 3, 700, "m0");
    auto other =
        open_transaction(f,
                         "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, "
                         "currency, stripe_customer_id) VALUES ($1, 'other-writer', '2026-11', 1, "
                         "'usd', 'cus_ok')",
                         keys[1]);

    std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> ops;
    auto plug = record_for("meanwhile-plug", "2026-11", 99, "m0p");
    auto holder = hold_row(f, hold_insert, plug.key);
    ops.push_back([&l, plug]() { return l.preflight(plug, 30s); });
    for (auto& r : recs) ops.push_back([&l, r]() { return l.preflight(r, 30s); });
    auto out = run_all<result<billing::preflight_result>>(f, std::move(ops), [&]() {
        return commit_once_the_batch_waits(&f, &l, recs.size(), &holder, &other);
    });
    out.erase(out.begin());
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);
    for (auto& o : out) BOOST_TEST_REQUIRE(o.has_value(), (o ? "" : o.err().describe()));
    BOOST_TEST(out[0]->inserted);
    BOOST_TEST(out[2]->inserted);
    BOOST_TEST(!out[1]->inserted);
    BOOST_TEST(out[1]->record.key == keys[1]);
    BOOST_TEST(out[1]->record.customer_id == "other-writer");
    BOOST_TEST(count_leased(f, {keys[0], keys[2]}) == 2);
}

BOOST_AUTO_TEST_SUITE_END()
