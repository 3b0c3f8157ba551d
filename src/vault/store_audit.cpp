// vault::store: the audit trail — the proxy's batches of audit rows, one statement each, and a key's recent
// rows. The rest of the store is in store.cpp.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pg/array_literal.hpp"
#include "pg/rows.hpp"
#include "vault/store.hpp"

namespace cg::vault {
namespace {

const std::string audit_sql =
    "INSERT INTO vault_audit (vault_key_id, method, path, amount_cents, idempotency_key, upstream_status, "
    "outcome, latency_ms, request_id) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::int[], "
    "$7::text[], "
    "$8::float8[], $9::text[])";

const std::string recent_audit_sql =
    "SELECT vault_key_id, method, path, amount_cents, idempotency_key, upstream_status, outcome, latency_ms, "
    "request_id, at FROM vault_audit WHERE vault_key_id = $1 ORDER BY at DESC, id DESC LIMIT $2::int";

// One audit column as an array literal: `f` gives each row's value (nullopt: NULL).
template <typename T, typename F>
std::string array_of(const std::vector<audit_row>& rows, F f) {
    using element = std::conditional_t<std::is_same_v<T, std::string>, std::string, std::int64_t>;
    std::vector<std::optional<element>> column;
    column.reserve(rows.size());
    for (const auto& row : rows) {
        std::optional<T> v = f(row);
        column.push_back(v ? std::optional<element>(*v) : std::nullopt);
    }
    if constexpr (std::is_same_v<T, std::string>)
        return pg::text_array_literal(column);
    else
        return pg::int_array_literal(column);
}

}  // namespace

net::awaitable<result<void>> store::write_audit(std::vector<audit_row> rows) {
    if (rows.empty()) co_return result<void>{};
    pg::params p;
    p.add(array_of<std::string>(rows, [](const audit_row& a) { return a.key_id; }));
    p.add(
        array_of<std::string>(rows, [](const audit_row& a) { return std::optional<std::string>(a.method); }));
    p.add(array_of<std::string>(rows, [](const audit_row& a) { return std::optional<std::string>(a.path); }));
    p.add(array_of<std::int64_t>(rows, [](const audit_row& a) { return a.amount_cents; }));
    p.add(array_of<std::string>(rows, [](const audit_row& a) { return a.idempotency_key; }));
    p.add(array_of<int>(rows, [](const audit_row& a) { return a.upstream_status; }));
    p.add(array_of<std::string>(rows,
                                [](const audit_row& a) { return std::optional<std::string>(a.outcome); }));
    p.add(array_of<std::string>(rows, [](const audit_row& a) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3f", a.latency_ms);
        return std::optional<std::string>(buf);
    }));
    p.add(array_of<std::string>(rows, [](const audit_row& a) { return a.request_id; }));
    auto r = co_await pg::exec_pooled(pool_, audit_sql, std::move(p));
    if (!r) co_return r.err();
    co_return result<void>{};
}

net::awaitable<result<std::vector<audit_row>>> store::recent_audit(std::string key_id, int limit) {
    auto r = co_await pg::exec_pooled(pool_, recent_audit_sql, pg::params(std::move(key_id), limit));
    if (!r) co_return r.err();
    std::vector<audit_row> out;
    for (std::size_t i = 0; i < r->size(); ++i) {
        audit_row a;
        a.key_id = r->get<std::optional<std::string>>(i, 0);
        a.method = r->get<std::string>(i, 1);
        a.path = r->get<std::string>(i, 2);
        a.amount_cents = r->get<std::optional<std::int64_t>>(i, 3);
        a.idempotency_key = r->get<std::optional<std::string>>(i, 4);
        if (auto s = r->get<std::optional<std::int32_t>>(i, 5)) a.upstream_status = *s;
        a.outcome = r->get<std::string>(i, 6);
        a.latency_ms = std::stod(r->get<std::string>(i, 7));
        a.request_id = r->get<std::optional<std::string>>(i, 8);
        a.at = r->get<pg::timestamp>(i, 9);
        out.push_back(std::move(a));
    }
    co_return out;
}

}  // namespace cg::vault
