// Helpers for the ledger batch tests: concurrent callers on the fixture's io_context, and a "plug" that holds
// a batcher's only slot until the callers under test queued behind it.
#pragma once

#include <boost/test/unit_test.hpp>
#include <functional>
#include <vector>

#include "fixture.hpp"

namespace cg::test::batch {

using namespace std::chrono_literals;
using fixture = test::billing_fixture;
using cg::test::event_json;

// One slot: every caller arriving while a batch runs joins the next one. The first caller finds the slot
// free and goes alone at once (no linger), so the tests start a "plug" first: a statement for an unrelated
// row that another transaction holds locked until the callers under test have all queued behind it. Then
// they go together as the next statement, whatever the scheduling.
inline billing::ledger_options one_slot() {
    billing::ledger_options o;
    o.batch.max_in_flight = 1;
    return o;
}

// Every call its own single-row statement (the reference the batches are compared with).
inline billing::ledger_options unbatched() {
    billing::ledger_options o;
    o.batch.enabled = false;
    return o;
}

inline billing::new_record record_for(const std::string& customer, const std::string& period,
                                      std::int64_t amount, const std::string& message_id,
                                      const std::string& ns = test::key_namespace) {
    auto ev = billing::parse_event(event_json(customer, period, amount));
    BOOST_TEST_REQUIRE(ev.has_value());
    return {billing::base_key(ns, ev->customer_id, ev->billing_period), *ev, message_id, 1, ns};
}

// `n` records of period 2026-11 for customers "<customer_prefix><i>" with amount `first_amount + i` and
// message id "<message_prefix><i>", and their keys in the same order.
struct record_set {
    std::vector<billing::new_record> recs;
    std::vector<std::string> keys;
};
inline record_set records_for(const std::string& customer_prefix, int n, std::int64_t first_amount,
                              const std::string& message_prefix) {
    record_set out;
    for (int i = 0; i < n; ++i) {
        out.recs.push_back(record_for(customer_prefix + std::to_string(i), "2026-11", first_amount + i,
                                      message_prefix + std::to_string(i)));
        out.keys.push_back(out.recs.back().key);
    }
    return out;
}

// Runs every coroutine of `ops` concurrently on the fixture's io_context, and `alongside` with them, and
// returns the values of `ops` in order.
template <typename T>
std::vector<T> run_all(fixture& f, std::vector<std::function<net::awaitable<T>()>> ops,
                       std::function<net::awaitable<void>()> alongside = {}) {
    std::vector<std::optional<T>> outs(ops.size());
    std::size_t left = ops.size() + (alongside ? 1 : 0);
    bool done = left == 0;
    std::exception_ptr failed;
    if (alongside)
        asio::co_spawn(f.io, alongside(), [&](std::exception_ptr e) {
            if (e) failed = e;
            if (--left == 0) done = true;
        });
    for (std::size_t i = 0; i < ops.size(); ++i)
        asio::co_spawn(f.io, net::boxed(ops[i]()), [&, i](std::exception_ptr e, std::optional<T> v) {
            if (e) failed = e;
            if (!e) outs[i] = std::move(v);
            if (--left == 0) done = true;
        });
    test::run_until_done(f.io, done, 30s);
    BOOST_TEST_REQUIRE(done);
    if (failed) std::rethrow_exception(failed);
    std::vector<T> values;
    for (auto& o : outs) values.push_back(std::move(*o));
    return values;
}

// Another transaction that locks the plug's row: `lock_sql` ($1: the key) runs inside BEGIN, and the
// transaction stays open until release_when_queued() rolls it back.
inline pg::pooled_connection hold_row(fixture& f, const std::string& lock_sql, const std::string& key) {
    auto c = f.run(
        [](fixture* fx, std::string sql, std::string k) -> net::awaitable<result<pg::pooled_connection>> {
            auto c = co_await fx->pg->acquire();
            if (!c) co_return c.err();
            auto b = co_await (*c)->execute("BEGIN");
            if (!b) co_return b.err();
            auto r = co_await (*c)->query(sql, k);
            if (!r) co_return r.err();
            co_return std::move(*c);
        }(&f, lock_sql, key));
    BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.err().describe()));
    return std::move(*c);
}

inline const std::string hold_insert =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id) VALUES ($1, 'holder', 'hold-' || $1, 1, 'usd', 'cus_ok')";
inline const std::string hold_update = "SELECT 1 FROM billing_records WHERE key = $1 FOR UPDATE";

// Waits (polling, bounded) until `n` callers queued behind the plug in `which` batcher, then ends the
// holding transaction so the plug, then the queued batch, can go.
inline net::awaitable<void> release_when_queued(billing::ledger* l, bool settle, std::size_t n,
                                                pg::pooled_connection* holder) {
    net::steady_timer t(co_await asio::this_coro::executor);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    auto queued = [&] {
        auto c = l->batch_counters();
        return settle ? c.settle.queued : c.preflight.queued;
    };
    while (queued() < n && std::chrono::steady_clock::now() < deadline) {
        t.expires_after(1ms);
        co_await t.async_wait();
    }
    BOOST_TEST(queued() == n);
    auto r = co_await (*holder)->execute("ROLLBACK");
    BOOST_TEST(r.has_value());
    holder->release();
}

// How many of `keys` are pending, leased (epoch 1) with their first attempt recorded, and lease still
// running.
inline std::int64_t count_leased(fixture& f, const std::vector<std::string>& keys) {
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

inline net::awaitable<seen> preflight_and_look(fixture* f, billing::ledger* l, billing::new_record rec,
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

}  // namespace cg::test::batch
