// Group commit of the ledger's hot writes (ledger_batch.hpp), against the real server: concurrent pre-flights
// and settles share statements, each caller gets what its single statement would have given, a caller
// resumes only after the transaction holding its row committed, and a failed batch fails every caller in it
// with nothing half-written.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>
#include <functional>
#include <vector>

#include "batch_support.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::event_json;

namespace {

using namespace cg::test::batch;

std::int64_t count_leased(fixture& f, const std::vector<std::string>& keys) {
    std::string list = "{";
    for (std::size_t i = 0; i < keys.size(); ++i) list += (i ? "," : "") + keys[i];
    list += "}";
    return f.scalar(
        "SELECT count(*) FROM billing_records WHERE key = ANY($1::text[]) AND status = 'pending' AND "
        "lease_epoch = 1 AND stripe_attempts = 1 AND first_stripe_attempt_at IS NOT NULL AND lease_until > "
        "now()",
        list);
}

// What a caller saw when it resumed: its result, and how many of the batch's rows another connection could
// already read as committed, leased rows at that moment.
struct seen {
    result<billing::preflight_result> pf = error(pg::errc::protocol_error, "not run");
    std::int64_t committed_when_resumed = -1;
};

net::awaitable<seen> preflight_and_look(fixture* f, billing::ledger* l, billing::new_record rec,
                                        std::vector<std::string> keys) {
    seen s;
    s.pf = co_await l->preflight(std::move(rec), 30s);
    std::string list = "{";
    for (std::size_t i = 0; i < keys.size(); ++i) list += (i ? "," : "") + keys[i];
    list += "}";
    auto r = co_await f->query(
        "SELECT count(*) FROM billing_records WHERE key = ANY($1::text[]) AND status = 'pending' AND "
        "lease_epoch = 1 AND first_stripe_attempt_at IS NOT NULL",
        pg::params(list));
    if (r) s.committed_when_resumed = (*r)[0].get<std::int64_t>(0);
    co_return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_ledger_batch)

// 20 concurrent pre-flights of distinct keys: fewer statements than callers, every row inserted, leased
// (epoch 1) with its first attempt recorded, and every row of the batch committed before any caller resumes
// (another connection reads all 20 the moment the first caller continues: write-before-call).
BOOST_AUTO_TEST_CASE(concurrent_preflights_share_a_statement_and_resume_after_commit) {
    fixture f;
    std::vector<std::pair<std::string, std::size_t>> hook;  // what the metrics hook heard
    auto opts = one_slot();
    opts.on_batch = [&hook](std::string_view statement, std::size_t rows) {
        hook.emplace_back(std::string(statement), rows);
    };
    billing::ledger l(f.pg, std::move(opts));
    constexpr int n = 20;
    auto [recs, keys] = records_for("NULL.b@t_ch-", n, 1000, "b0");
    std::vector<std::function<net::awaitable<seen>()>> ops;
    auto plug = record_for("batch-plug", "2026-11", 999, "b0p");
    auto holder = hold_row(f, hold_insert, plug.key);
    ops.push_back([&]() { return preflight_and_look(&f, &l, plug, {plug.key}); });
    for (int i = 0; i < n; ++i) ops.push_back([&, i]() { return preflight_and_look(&f, &l, recs[i], keys); });
    auto out = run_all<seen>(f, std::move(ops), [&]() { return release_when_queued(&l, false, n, &holder); });
    out.erase(out.begin());

    auto c = l.batch_counters().preflight;
    BOOST_TEST(c.rows == static_cast<std::uint64_t>(n + 1));
    BOOST_TEST(c.statements == 2u);  // the plug, then the 20 together
    using heard = std::vector<std::pair<std::string, std::size_t>>;
    BOOST_TEST((hook == heard{{"preflight", 1}, {"preflight", static_cast<std::size_t>(n)}}));
    for (int i = 0; i < n; ++i) {
        BOOST_TEST_REQUIRE(out[i].pf.has_value(), (out[i].pf ? "" : out[i].pf.err().describe()));
        const auto& pf = *out[i].pf;
        BOOST_TEST(pf.inserted);
        BOOST_TEST(pf.record.key == keys[i]);
        BOOST_TEST(pf.record.amount_cents == 1000 + i);
        BOOST_TEST(pf.record.customer_id ==
                   "NULL.b@t_ch-" + std::to_string(i));  // "NULL…" stays text in the array
        BOOST_TEST(pf.record.lease_epoch == 1);
        BOOST_TEST(pf.record.stripe_attempts == 1);
        BOOST_TEST(pf.record.first_stripe_attempt_at.has_value());
        BOOST_TEST((pf.record.status == billing::record_status::pending));
        BOOST_TEST(out[i].committed_when_resumed == n);
    }
    BOOST_TEST(count_leased(f, keys) == n);
}

// One batch mixing fresh keys, a key already in the ledger (settled), the same fresh key twice, and a
// (customer, period) already recorded under another key: each caller gets what the single statement gives —
// compared field by field with a ledger that runs single statements only.
BOOST_AUTO_TEST_CASE(a_mixed_batch_gives_every_caller_its_single_statement_answer) {
    fixture f;
    billing::ledger single(f.pg, unbatched());
    billing::ledger l(f.pg, one_slot());

    // Already in the ledger: charged under our key, and pending under another namespace's key.
    auto charged = f.run(single.preflight(record_for("mix-old", "2026-11", 500, "c001"), 30s));
    BOOST_TEST_REQUIRE((charged.has_value() && charged->inserted));
    auto settled = f.run(single.mark_charged(charged->record.key, "ch_mix_old"));
    BOOST_TEST_REQUIRE((settled.has_value() && *settled));
    auto other = f.run(single.preflight(record_for("mix-ns", "2026-11", 700, "c002", "other-ns"), 30s));
    BOOST_TEST_REQUIRE((other.has_value() && other->inserted));

    std::vector<billing::new_record> recs = {
        record_for("mix-a", "2026-11", 101, "c101"), record_for("mix-old", "2026-11", 500, "c102"),
        record_for("mix-b", "2026-11", 102, "c103"), record_for("mix-ns", "2026-11", 700, "c104"),
        record_for("mix-b", "2026-11", 102, "c105"),  // the same fresh key again
        record_for("mix-c", "2026-11", 103, "c106"),
    };
    std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> ops;
    auto plug = record_for("mix-plug", "2026-11", 99, "c100");
    auto holder = hold_row(f, hold_insert, plug.key);
    ops.push_back([&l, plug]() { return l.preflight(plug, 30s); });
    for (auto& r : recs) ops.push_back([&l, r]() { return l.preflight(r, 30s); });
    auto out = run_all<result<billing::preflight_result>>(
        f, std::move(ops), [&]() { return release_when_queued(&l, false, recs.size(), &holder); });
    out.erase(out.begin());
    // The plug; the six but one key twice (a batch never holds one key twice); that key's second caller.
    BOOST_TEST(l.batch_counters().preflight.statements == 3u);
    for (auto& o : out) BOOST_TEST_REQUIRE(o.has_value(), (o ? "" : o.err().describe()));

    // Fresh keys: inserted, the row exactly as the database holds it, the lease remaining as given.
    for (std::size_t i : {0u, 2u, 5u}) {
        BOOST_TEST(out[i]->inserted);
        auto db = f.row(recs[i].key);
        BOOST_TEST_REQUIRE(db.has_value());
        const auto& got = out[i]->record;
        BOOST_TEST(got.key == db->key);
        BOOST_TEST(got.customer_id == db->customer_id);
        BOOST_TEST(got.billing_period == db->billing_period);
        BOOST_TEST(got.amount_cents == db->amount_cents);
        BOOST_TEST(got.currency == db->currency);
        BOOST_TEST(got.stripe_customer_id == db->stripe_customer_id);
        BOOST_TEST((got.status == db->status));
        BOOST_TEST(!got.charge_id.has_value());
        BOOST_TEST(got.key_generation == db->key_generation);
        BOOST_TEST((got.lease_until == db->lease_until));
        BOOST_TEST((got.first_stripe_attempt_at == db->first_stripe_attempt_at));
        BOOST_TEST(got.stripe_attempts == db->stripe_attempts);
        BOOST_TEST(got.lease_epoch == db->lease_epoch);
        BOOST_TEST((got.lease_remaining == std::optional<std::chrono::milliseconds>(30s)));
    }
    // The single statement's answer for a fresh row carries the same remaining lease.
    auto lone = f.run(single.preflight(record_for("mix-lone", "2026-11", 104, "c107"), 30s));
    BOOST_TEST_REQUIRE((lone.has_value() && lone->inserted));
    BOOST_TEST((lone->record.lease_remaining == std::optional<std::chrono::milliseconds>(30s)));

    // The key already in the ledger: not inserted, its charged row.
    BOOST_TEST(!out[1]->inserted);
    BOOST_TEST(out[1]->record.key == recs[1].key);
    BOOST_TEST((out[1]->record.status == billing::record_status::charged));
    BOOST_TEST((out[1]->record.charge_id == std::optional<std::string>("ch_mix_old")));
    // (customer, period) under another key: not inserted, that other row.
    BOOST_TEST(!out[3]->inserted);
    BOOST_TEST(out[3]->record.key == other->record.key);
    BOOST_TEST(out[3]->record.key != recs[3].key);
    // The same key twice: exactly one caller inserted it; the other sees that row, leased by the first.
    BOOST_TEST(out[2]->inserted != out[4]->inserted);
    const auto& loser = out[2]->inserted ? *out[4] : *out[2];
    BOOST_TEST(loser.record.key == recs[2].key);
    BOOST_TEST(loser.record.lease_epoch == 1);
    BOOST_TEST(loser.record.lease_remaining.has_value());
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE customer_id = 'mix-b'") == 1);
}

// A batch whose transaction fails (a statement timeout: another transaction holds one of its keys
// uncommitted) fails every caller with the timeout, and writes none of its rows; the same batch again
// succeeds once the other transaction is gone.
BOOST_AUTO_TEST_CASE(a_failed_batch_fails_every_caller_and_writes_nothing) {
    fixture f;
    pg::pool_options po;
    po.server = f.db.config();
    po.size = 4;
    po.conn.query_timeout = 1500ms;
    po.conn.cancel_grace = 1s;
    auto short_pool = pg::pool::create(f.io.get_executor(), f.pool.get_executor(), po, logger());
    billing::ledger l(short_pool, one_slot());

    std::vector<billing::new_record> recs;
    std::vector<std::string> keys;
    for (int i = 0; i < 6; ++i) {
        recs.push_back(record_for("fail-" + std::to_string(i), "2026-11", 300 + i, "f0" + std::to_string(i)));
        keys.push_back(recs.back().key);
    }
    // Another transaction inserts key 3 and stays open: the batch's insert waits on it past its timeout.
    auto blocker = f.run([](fixture* fx, std::string key) -> net::awaitable<result<pg::pooled_connection>> {
        auto c = co_await fx->pg->acquire();
        if (!c) co_return c.err();
        auto b = co_await (*c)->execute("BEGIN");
        if (!b) co_return b.err();
        auto ins = co_await (*c)->query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id) VALUES ($1, 'blocker', '2026-11', 1, 'usd', 'cus_ok')",
            key);
        if (!ins) co_return ins.err();
        co_return std::move(*c);
    }(&f, keys[3]));
    BOOST_TEST_REQUIRE(blocker.has_value(), (blocker ? "" : blocker.err().describe()));

    int plugs = 0;
    auto attempt = [&]() {
        std::vector<std::function<net::awaitable<result<billing::preflight_result>>()>> ops;
        auto plug = record_for("fail-plug-" + std::to_string(plugs++), "2026-11", 99, "f0p");
        auto holder = hold_row(f, hold_insert, plug.key);
        ops.push_back([&l, plug]() { return l.preflight(plug, 30s); });
        for (auto& r : recs) ops.push_back([&l, r]() { return l.preflight(r, 30s); });
        auto out = run_all<result<billing::preflight_result>>(
            f, std::move(ops), [&]() { return release_when_queued(&l, false, recs.size(), &holder); });
        BOOST_TEST_REQUIRE(out[0].has_value(), (out[0] ? "" : out[0].err().describe()));
        out.erase(out.begin());
        return out;
    };
    auto failed = attempt();
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);  // the plug, then the six together
    for (auto& o : failed) {
        BOOST_TEST_REQUIRE(!o.has_value());
        BOOST_TEST((o.code() == pg::errc::timeout), o.err().describe());
    }
    auto rolled_back = f.run([](pg::pooled_connection* c) -> net::awaitable<result<void>> {
        co_return co_await (*c)->execute("ROLLBACK");
    }(&*blocker));
    BOOST_TEST_REQUIRE(rolled_back.has_value());
    blocker->release();
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE customer_id LIKE 'fail-_'") == 0);

    auto again = attempt();
    for (std::size_t i = 0; i < again.size(); ++i) {
        BOOST_TEST_REQUIRE(again[i].has_value(), (again[i] ? "" : again[i].err().describe()));
        BOOST_TEST(again[i]->inserted);
        BOOST_TEST(again[i]->record.key == keys[i]);
    }
    BOOST_TEST(count_leased(f, keys) == 6);
    f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<bool> {
        co_await p->close();
        co_return true;
    }(short_pool));
}

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

// Concurrent settles share a statement: each pending row settled as asked (status, charge id, intent, the
// lease dropped, the epoch moved by one); a row already settled answers false and stays as it was, exactly as
// the single statement answers it.
BOOST_AUTO_TEST_CASE(concurrent_settles_share_a_statement_and_answer_per_row) {
    fixture f;
    billing::ledger single(f.pg, unbatched());
    billing::ledger l(f.pg, one_slot());
    std::vector<std::string> keys;
    for (int i = 0; i < 9; ++i) {  // the ninth: the plug
        auto pf =
            f.run(single.preflight(record_for("settle-" + std::to_string(i), "2026-11", 900 + i, "s0"), 30s));
        BOOST_TEST_REQUIRE((pf.has_value() && pf->inserted));
        keys.push_back(pf->record.key);
    }
    auto first = f.run(single.mark_charged(keys[7], "ch_settle_first"));
    BOOST_TEST_REQUIRE((first.has_value() && *first));
    // The single statement's answer for a settled row.
    auto single_again = f.run(single.mark_charged(keys[7], "ch_settle_again"));
    BOOST_TEST_REQUIRE(single_again.has_value());
    BOOST_TEST(!*single_again);

    std::vector<std::function<net::awaitable<result<bool>>()>> ops;
    auto holder = hold_row(f, hold_update, keys[8]);
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[8], "ch_settle_plug"); });
    for (int i = 0; i < 5; ++i)
        ops.push_back([&l, &keys, i]() {
            return l.mark_charged(keys[i], "ch_settle_" + std::to_string(i),
                                  i == 2 ? std::optional<std::string>("pi_settle_2") : std::nullopt);
        });
    ops.push_back([&l, &keys]() { return l.mark_declined(keys[5], "ch_declined_5", "card_declined"); });
    ops.push_back([&l, &keys]() { return l.mark_declined(keys[6], std::nullopt, "no charge id"); });
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[7], "ch_settle_late"); });
    auto out =
        run_all<result<bool>>(f, std::move(ops), [&]() { return release_when_queued(&l, true, 8, &holder); });
    BOOST_TEST_REQUIRE((out[0].has_value() && *out[0]));
    out.erase(out.begin());
    auto c = l.batch_counters().settle;
    BOOST_TEST(c.rows == 9u);
    BOOST_TEST(c.statements == 2u);  // the plug, then the eight together
    for (std::size_t i = 0; i < out.size(); ++i) {
        BOOST_TEST_REQUIRE(out[i].has_value(), (out[i] ? "" : out[i].err().describe()));
        BOOST_TEST(*out[i] == (i != 7));
    }
    auto status_of = [&](const std::string& key) {
        auto r =
            f.run(f.query("SELECT status, coalesce(charge_id, ''), coalesce(payment_intent_id, ''), "
                          "coalesce(last_error, ''), "
                          "lease_until IS NULL, lease_epoch FROM billing_records WHERE key = $1",
                          pg::params(key)));
        BOOST_TEST_REQUIRE(r.has_value());
        return (*r)[0].as<std::string, std::string, std::string, std::string, bool, std::int64_t>();
    };
    for (int i = 0; i < 5; ++i) {
        auto [st, ch, pi, err, no_lease, epoch] = status_of(keys[i]);
        BOOST_TEST(st == "charged");
        BOOST_TEST(ch == "ch_settle_" + std::to_string(i));
        BOOST_TEST(pi == (i == 2 ? "pi_settle_2" : ""));
        BOOST_TEST(no_lease);
        BOOST_TEST(epoch == 2);
    }
    auto [st5, ch5, pi5, err5, nl5, ep5] = status_of(keys[5]);
    BOOST_TEST(st5 == "declined");
    BOOST_TEST(ch5 == "ch_declined_5");
    BOOST_TEST(err5 == "card_declined");
    BOOST_TEST(nl5);
    auto [st6, ch6, pi6, err6, nl6, ep6] = status_of(keys[6]);
    BOOST_TEST(st6 == "declined");
    BOOST_TEST(ch6.empty());
    BOOST_TEST(err6 == "no charge id");
    auto [st7, ch7, pi7, err7, nl7, ep7] = status_of(keys[7]);
    BOOST_TEST(st7 == "charged");
    BOOST_TEST(ch7 == "ch_settle_first");  // untouched by the late settle
    BOOST_TEST(ep7 == 2);
}

// A row-level error inside a batch (two rows given the same charge id: the unique index on charge_id) does
// not fail the batch's other callers: the batch is retried row by row, and each caller gets its single
// statement's answer — the first row charged, the second unique_violation, the third charged.
BOOST_AUTO_TEST_CASE(a_row_level_error_in_a_batch_fails_only_its_own_caller) {
    fixture f;
    billing::ledger l(f.pg, one_slot());
    std::vector<std::string> keys;
    for (int i = 0; i < 4; ++i) {  // the fourth: the plug
        auto pf =
            f.run(l.preflight(record_for("dup-charge-" + std::to_string(i), "2026-11", 400, "d0"), 30s));
        BOOST_TEST_REQUIRE((pf.has_value() && pf->inserted));
        keys.push_back(pf->record.key);
    }
    auto before = l.batch_counters().settle.statements;
    std::vector<std::function<net::awaitable<result<bool>>()>> ops;
    auto holder = hold_row(f, hold_update, keys[3]);
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[3], "ch_plug"); });
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[0], "ch_same"); });
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[1], "ch_same"); });
    ops.push_back([&l, &keys]() { return l.mark_charged(keys[2], "ch_other"); });
    auto out =
        run_all<result<bool>>(f, std::move(ops), [&]() { return release_when_queued(&l, true, 3, &holder); });
    BOOST_TEST_REQUIRE((out[0].has_value() && *out[0]));
    out.erase(out.begin());
    BOOST_TEST(l.batch_counters().settle.statements - before == 2u);  // the plug, then the three together
    BOOST_TEST_REQUIRE(out[0].has_value());
    BOOST_TEST(*out[0]);
    BOOST_TEST_REQUIRE(!out[1].has_value());
    BOOST_TEST((out[1].code() == pg::errc::unique_violation), out[1].err().describe());
    BOOST_TEST_REQUIRE(out[2].has_value());
    BOOST_TEST(*out[2]);
    BOOST_TEST((f.row(keys[1])->status == billing::record_status::pending));
}

// The linger (batch_options.linger, set by the pipeline from Stripe's pace): with both slots free, callers
// that arrive 5 ms apart within the wait share ONE statement (without it the first two would each go alone
// on a free slot), and every row is committed before any of them resumes.
BOOST_AUTO_TEST_CASE(a_lingering_slot_gathers_callers_that_arrive_apart) {
    fixture f;
    billing::ledger l(f.pg);  // default options: two slots
    l.set_linger(400ms);
    BOOST_TEST(l.linger() == std::chrono::microseconds(400ms));
    constexpr int n = 8;
    auto [recs, keys] = records_for("linger-", n, 500, "bl");
    std::vector<std::function<net::awaitable<seen>()>> ops;
    for (int i = 0; i < n; ++i)
        ops.push_back([&, i]() -> net::awaitable<seen> {
            net::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(5 * i));
            co_await t.async_wait();  // the arrival pattern under test, not synchronisation
            co_return co_await preflight_and_look(&f, &l, recs[i], keys);
        });
    auto t0 = std::chrono::steady_clock::now();
    auto out = run_all<seen>(f, std::move(ops));
    auto took = std::chrono::steady_clock::now() - t0;
    auto c = l.batch_counters().preflight;
    BOOST_TEST(c.statements == 1u);
    BOOST_TEST(c.rows == static_cast<std::uint64_t>(n));
    BOOST_TEST(took >= 400ms);  // the first caller waited out the linger
    for (int i = 0; i < n; ++i) {
        BOOST_TEST_REQUIRE(out[i].pf.has_value(), (out[i].pf ? "" : out[i].pf.err().describe()));
        BOOST_TEST(out[i].pf->inserted);
        BOOST_TEST(out[i].committed_when_resumed == n);
    }
    BOOST_TEST(count_leased(f, keys) == n);
}

// A lingering slot leaves as soon as max_rows callers queued (the wait is only for company), and with the
// linger set back to zero the next caller goes alone at once.
BOOST_AUTO_TEST_CASE(a_full_batch_ends_the_linger_and_zero_means_no_wait) {
    fixture f;
    billing::ledger_options o;
    o.batch.max_rows = 4;
    billing::ledger l(f.pg, std::move(o));
    l.set_linger(std::chrono::seconds(20));
    std::vector<billing::new_record> recs;
    for (int i = 0; i < 4; ++i)
        recs.push_back(
            record_for("linger-full-" + std::to_string(i), "2026-11", 700, "bf" + std::to_string(i)));
    std::vector<std::function<net::awaitable<seen>()>> ops;
    for (int i = 0; i < 4; ++i)
        ops.push_back([&, i]() { return preflight_and_look(&f, &l, recs[i], {recs[i].key}); });
    auto t0 = std::chrono::steady_clock::now();
    auto out = run_all<seen>(f, std::move(ops));
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 10s);  // not the 20 s linger
    BOOST_TEST(l.batch_counters().preflight.statements == 1u);
    for (auto& o2 : out) BOOST_TEST((o2.pf && o2.pf->inserted));

    l.set_linger(std::chrono::microseconds(0));
    auto lone = record_for("linger-lone", "2026-11", 701, "bf9");
    t0 = std::chrono::steady_clock::now();
    auto one = run_all<seen>(f, {[&]() { return preflight_and_look(&f, &l, lone, {lone.key}); }});
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 10s);
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);
    BOOST_TEST((one[0].pf && one[0].pf->inserted));
}

BOOST_AUTO_TEST_SUITE_END()
