#include "billing/store/ledger_runners.hpp"

#include <algorithm>

#include "billing/store/ledger_sql.hpp"

namespace cg::billing::ledger_detail {
namespace {

using ms = std::chrono::milliseconds;
using namespace ledger_sql;

// A failed batch statement whose error belongs to one row (a bad value, a constraint, a deadlock with
// another batch) is retried row by row, so each caller gets exactly what its single statement gives and one
// bad row cannot fail the others forever. Reaching the server (lost, timeout, unavailable …) fails them all.
bool retry_row_by_row(const std::error_code& ec) {
    using pg::errc;
    if (ec.category() != pg::category()) return false;
    switch (static_cast<errc>(ec.value())) {
        case errc::unique_violation:
        case errc::foreign_key_violation:
        case errc::check_violation:
        case errc::not_null_violation:
        case errc::integrity_violation:
        case errc::serialization_failure:
        case errc::deadlock:
        case errc::data_exception:
            return true;
        default:
            return false;
    }
}

// Requests in key order (the order their rows are locked in, so two concurrent batches cannot deadlock on
// each other), as indexes into `keys`.
template <typename Req, typename KeyOf>
std::vector<std::size_t> key_order(const std::vector<Req>& reqs, KeyOf key_of) {
    std::vector<std::size_t> order(reqs.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return key_of(reqs[a]) < key_of(reqs[b]); });
    return order;
}

// An absent optional text column is NULL, never '' (the CHECKs of payment_method and key_namespace refuse
// ''): no payment method for an event charged through /v1/charges, no namespace for a row whose writer had
// none.
std::optional<std::string> text_or_null(const std::string& v) {
    if (v.empty()) return std::nullopt;
    return v;
}
std::optional<std::string_view> view_or_null(const std::string& v) {
    if (v.empty()) return std::nullopt;
    return std::string_view(v);
}

// `n` results, each `e`.
template <typename T>
std::vector<result<T>> failed_all(std::size_t n, const error& e) {
    std::vector<result<T>> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.emplace_back(e);
    return out;
}

}  // namespace

ledger_record decode_record(const pg::rows& r, std::size_t i) {
    auto rec = decode_stored_record_columns(r, i);
    if (auto left = r.get<std::optional<std::int64_t>>(i, record_col::lease_remaining_ms))
        rec.lease_remaining = ms(*left);
    rec.lease_epoch = r.get<std::int64_t>(i, record_col::lease_epoch);
    return rec;
}

net::awaitable<result<pg::rows>> exec(std::shared_ptr<pg::pool> pool, const std::string& sql, pg::params p) {
    return pg::exec_pooled(std::move(pool), sql, std::move(p), pg::acquire_mode::wait_for_server);
}

net::awaitable<result<preflight_out>> preflight_insert_one(std::shared_ptr<pg::pool> pool,
                                                           const preflight_req& q) {
    const auto& e = q.rec.event;
    auto ins =
        co_await exec(pool, preflight_insert_sql,
                      pg::params(q.rec.key, e.customer_id, e.billing_period, e.amount_cents, e.currency,
                                 e.stripe_customer_id, q.lease_ms, q.rec.nsq_message_id, q.rec.nsq_attempts,
                                 e.description, text_or_null(e.payment_method), e.off_session,
                                 text_or_null(q.rec.key_namespace), text_or_null(e.stripe_account)));
    if (!ins) co_return ins.err();
    if (ins->empty()) co_return preflight_out();
    co_return preflight_out{true, std::make_unique<ledger_record>(decode_record(*ins, 0)), std::nullopt};
}

net::awaitable<std::vector<result<preflight_out>>> preflight_runner::run(std::shared_ptr<pg::pool> pool,
                                                                         std::vector<preflight_req>& reqs) {
    auto outs = co_await run_statements(std::move(pool), reqs);
    // A conflict whose row was not read gets its request back for the caller's own read (the batch is done
    // with it): the caller keeps no copy of its own meanwhile.
    for (std::size_t i = 0; i < outs.size() && i < reqs.size(); ++i)
        if (outs[i] && !outs[i]->inserted && !outs[i]->row) outs[i]->unread = std::move(reqs[i].rec);
    co_return outs;
}

net::awaitable<std::vector<result<preflight_out>>> preflight_runner::run_statements(
    std::shared_ptr<pg::pool> pool, std::vector<preflight_req>& reqs) {
    std::vector<result<preflight_out>> outs;
    outs.reserve(reqs.size());
    if (reqs.size() == 1) {
        outs.push_back(co_await preflight_insert_one(pool, reqs[0]));
        co_return outs;
    }
    auto order = key_order(reqs, key);
    // The columns as views of the requests (which outlive the statement): one literal per column, no copy
    // per element.
    std::vector<std::string_view> keys, customers, periods, currencies, stripe_customers, message_ids;
    std::vector<std::string_view> descriptions, off_sessions;
    std::vector<std::optional<std::string_view>> payment_methods, namespaces, accounts;
    std::vector<std::int64_t> amounts, leases, attempts;
    for (auto* v : {&keys, &customers, &periods, &currencies, &stripe_customers, &message_ids, &descriptions,
                    &off_sessions})
        v->reserve(reqs.size());
    payment_methods.reserve(reqs.size());
    namespaces.reserve(reqs.size());
    accounts.reserve(reqs.size());
    for (auto* v : {&amounts, &leases, &attempts}) v->reserve(reqs.size());
    for (auto i : order) {
        const auto& q = reqs[i];
        keys.emplace_back(q.rec.key);
        customers.emplace_back(q.rec.event.customer_id);
        periods.emplace_back(q.rec.event.billing_period);
        amounts.push_back(q.rec.event.amount_cents);
        currencies.emplace_back(q.rec.event.currency);
        stripe_customers.emplace_back(q.rec.event.stripe_customer_id);
        leases.push_back(q.lease_ms);
        message_ids.emplace_back(q.rec.nsq_message_id);
        attempts.push_back(q.rec.nsq_attempts);
        descriptions.emplace_back(q.rec.event.description);
        payment_methods.push_back(view_or_null(q.rec.event.payment_method));
        off_sessions.emplace_back(q.rec.event.off_session ? "t" : "f");
        namespaces.push_back(view_or_null(q.rec.key_namespace));
        accounts.push_back(view_or_null(q.rec.event.stripe_account));
    }
    pg::params p;
    p.reserve(14);
    p.add(text_array_literal(keys)).add(text_array_literal(customers)).add(text_array_literal(periods));
    p.add(int_array_literal(amounts)).add(text_array_literal(currencies));
    p.add(text_array_literal(stripe_customers)).add(int_array_literal(leases));
    p.add(text_array_literal(message_ids)).add(int_array_literal(attempts));
    p.add(text_array_literal(descriptions)).add(text_array_literal(payment_methods));
    p.add(text_array_literal(off_sessions)).add(text_array_literal(namespaces));
    p.add(text_array_literal(accounts));
    auto r = co_await exec(pool, preflight_batch_sql, std::move(p));
    if (!r) {
        if (retry_row_by_row(r.code())) {
            for (const auto& q : reqs) outs.push_back(co_await preflight_insert_one(pool, q));
        } else {
            for (std::size_t i = 0; i < reqs.size(); ++i) outs.push_back(r.err());
        }
        co_return outs;
    }
    std::vector<preflight_out> rows(reqs.size());
    for (std::size_t row = 0; row < r->size(); ++row) {
        if (!r->get<bool>(row, preflight_batch_inserted_column)) {
            // Found: the existing row of the request at this (1-based) position of the arrays.
            auto at = r->get<std::int64_t>(row, preflight_batch_index_column);
            if (at < 1 || static_cast<std::size_t>(at) > keys.size())
                co_return failed_all<preflight_out>(
                    reqs.size(),
                    error(pg::errc::protocol_error, "pre-flight batch returned an unknown position"));
            auto i = order[static_cast<std::size_t>(at - 1)];
            rows[i] =
                preflight_out{false, std::make_unique<ledger_record>(decode_record(*r, row)), std::nullopt};
            continue;
        }
        // Inserted: keys are unique in a batch and `keys` is sorted, so the key finds its caller.
        auto k = r->get<std::string_view>(row, 0);
        auto at = std::lower_bound(keys.begin(), keys.end(), k);
        if (at == keys.end() || *at != k)
            co_return failed_all<preflight_out>(
                reqs.size(), error(pg::errc::protocol_error, "pre-flight batch returned an unknown key"));
        auto i = order[static_cast<std::size_t>(at - keys.begin())];
        auto rec = std::make_unique<ledger_record>(decode_stored_record_columns(*r, row));
        rec->lease_epoch = r->get<std::int64_t>(row, record_col::lease_epoch);
        rec->lease_remaining = ms(reqs[i].lease_ms);
        rows[i] = preflight_out{true, std::move(rec), std::nullopt};
    }
    co_await read_conflicts(pool, reqs, rows);
    for (auto& one : rows) outs.push_back(std::move(one));
    co_return outs;
}

net::awaitable<void> preflight_runner::read_conflicts(std::shared_ptr<pg::pool> pool,
                                                      const std::vector<preflight_req>& reqs,
                                                      std::vector<preflight_out>& rows) {
    std::vector<std::size_t> at;
    std::vector<std::string_view> keys, customers, periods, accounts;
    at.reserve(reqs.size());
    for (auto* v : {&keys, &customers, &periods, &accounts}) v->reserve(reqs.size());
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        if (rows[i].inserted || rows[i].row) continue;  // inserted, or found by the batch statement
        at.push_back(i);
        keys.emplace_back(reqs[i].rec.key);
        customers.emplace_back(reqs[i].rec.event.customer_id);
        periods.emplace_back(reqs[i].rec.event.billing_period);
        accounts.emplace_back(reqs[i].rec.event.stripe_account);
    }
    if (at.empty()) co_return;
    pg::params p;
    p.reserve(4);
    p.add(text_array_literal(keys)).add(text_array_literal(customers)).add(text_array_literal(periods));
    p.add(text_array_literal(accounts));
    auto r = co_await exec(pool, preflight_existing_batch_sql, std::move(p));
    if (!r) co_return;
    const int index_column = r->columns() - 1;
    for (std::size_t row = 0; row < r->size(); ++row) {
        auto i = r->get<std::int64_t>(row, index_column);
        if (i < 1 || static_cast<std::size_t>(i) > at.size()) continue;
        rows[at[static_cast<std::size_t>(i - 1)]].row =
            std::make_unique<ledger_record>(decode_record(*r, row));
    }
}

net::awaitable<result<bool>> settle_one(std::shared_ptr<pg::pool> pool, const settle_req& q) {
    auto r = co_await exec(
        pool, settle_sql,
        pg::params(q.key, std::string(to_string(q.status)), q.charge_id, q.last_error, q.payment_intent_id));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<std::vector<result<bool>>> settle_runner::run(std::shared_ptr<pg::pool> pool,
                                                             std::vector<settle_req>& reqs) {
    std::vector<result<bool>> outs;
    outs.reserve(reqs.size());
    if (reqs.size() == 1) {
        outs.push_back(co_await settle_one(pool, reqs[0]));
        co_return outs;
    }
    auto order = key_order(reqs, key);
    std::vector<std::string> keys, statuses;
    std::vector<std::optional<std::string>> charges, errors, intents;
    for (auto i : order) {
        auto& q = reqs[i];
        keys.push_back(q.key);
        statuses.emplace_back(to_string(q.status));
        charges.push_back(q.charge_id);
        errors.push_back(q.last_error);
        intents.push_back(q.payment_intent_id);
    }
    pg::params p;
    p.reserve(5);
    p.add(text_array_literal(keys)).add(text_array_literal(statuses)).add(text_array_literal(charges));
    p.add(text_array_literal(errors)).add(text_array_literal(intents));
    auto r = co_await exec(pool, settle_batch_sql, std::move(p));
    if (!r) {
        if (retry_row_by_row(r.code())) {
            for (const auto& q : reqs) outs.push_back(co_await settle_one(pool, q));
        } else {
            for (std::size_t i = 0; i < reqs.size(); ++i) outs.push_back(r.err());
        }
        co_return outs;
    }
    std::vector<char> settled(reqs.size(), 0);
    for (std::size_t row = 0; row < r->size(); ++row) {
        auto k = r->get<std::string_view>(row, 0);
        auto at = std::lower_bound(keys.begin(), keys.end(), k);
        if (at == keys.end() || *at != k)
            co_return std::vector<result<bool>>(
                reqs.size(), error(pg::errc::protocol_error, "settle batch returned an unknown key"));
        settled[order[static_cast<std::size_t>(at - keys.begin())]] = 1;
    }
    for (auto one : settled) outs.push_back(one != 0);
    co_return outs;
}

}  // namespace cg::billing::ledger_detail
