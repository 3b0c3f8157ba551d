// vault::store: the leases of a key's cap (migration 0025, docs/design.md §5 "Cap leases") — taken and
// topped up, spends recorded as reservation rows, given back. The rest of the store is in store.cpp.
#include <optional>
#include <string>
#include <vector>

#include "pg/array_literal.hpp"
#include "pg/rows.hpp"
#include "vault/store.hpp"

namespace cg::vault {
namespace {

const std::string lease_take_sql =
    "SELECT lease_id, granted, usable FROM cg_vault_lease_take($1::text, $2::bigint, $3::text, $4::bigint, "
    "$5::bigint, $6::bigint)";

const std::string lease_record_sql =
    "SELECT ord, outcome, state FROM cg_vault_lease_record($1::text, $2::bigint, $3::text[], $4::bigint[], "
    "$5::text[], $6::text[], $7::text[], $8::bigint) ORDER BY ord";

const std::string lease_return_sql =
    "SELECT cg_vault_lease_return($1::text, $2::bigint, $3::text, $4::bigint, $5::boolean)";

const std::string expired_lease_cents_sql =
    "SELECT coalesce(sum(granted_cents - spent_cents), 0)::bigint FROM vault_leases "
    "WHERE closed_at IS NULL AND expires_at < now()";

const std::string open_leases_sql =
    "SELECT id, holder, granted_cents, spent_cents, taken_at, expires_at, expires_at < now() FROM "
    "vault_leases "
    "WHERE vault_key_id = $1 AND closed_at IS NULL ORDER BY id";

// The forfeit's transaction: the key's row first, as every lease statement locks it (cg_vault_lease_take,
// _record, _return), so no holder renews, records or returns meanwhile; then the lease, whose expiry and
// held cents are read under that lock; then cg_vault_lease_forfeit.
const std::string forfeit_lock_key_sql = "SELECT 1 FROM vault_keys WHERE id = $1 FOR NO KEY UPDATE";
const std::string forfeit_lock_lease_sql =
    "SELECT granted_cents - spent_cents, expires_at < now() FROM vault_leases "
    "WHERE id = $1::bigint AND vault_key_id = $2::text AND closed_at IS NULL FOR UPDATE";
const std::string forfeit_sql = "SELECT cg_vault_lease_forfeit($1::bigint, $2::bigint)";

}  // namespace

net::awaitable<result<store::lease_grant>> store::lease_take(std::string key_id,
                                                             std::optional<std::int64_t> lease,
                                                             std::string holder, std::int64_t want,
                                                             std::int64_t min,
                                                             std::chrono::milliseconds ttl) {
    pg::params p;
    p.add(std::move(key_id)).add(lease).add(std::move(holder)).add(want).add(min);
    p.add(static_cast<std::int64_t>(ttl.count()));
    auto r = co_await pg::exec_pooled(pool_, lease_take_sql, std::move(p));
    if (!r) co_return r.err();
    if (r->size() != 1)
        throw pg::column_error("cg_vault_lease_take returned " + std::to_string(r->size()) + " rows");
    lease_grant g;
    g.lease_id = r->get<std::optional<std::int64_t>>(0, 0);
    g.granted_cents = r->get<std::int64_t>(0, 1);
    g.usable = r->get<bool>(0, 2);
    co_return g;
}

net::awaitable<result<std::vector<reserve_result>>> store::lease_record(
    std::string key_id, std::int64_t lease, const std::vector<reserve_request>& rs) {
    std::vector<reserve_result> out;
    if (rs.empty()) co_return out;
    std::vector<std::optional<std::string>> idems, paths, bodies, customers;
    std::vector<std::int64_t> amounts;
    for (const auto& q : rs) {
        idems.emplace_back(q.idempotency_key);
        paths.emplace_back(q.path);
        bodies.emplace_back(q.body);
        customers.emplace_back(q.customer.empty() ? std::nullopt : std::optional<std::string>(q.customer));
        amounts.push_back(q.amount_cents);
    }
    pg::params p;
    p.add(std::move(key_id)).add(lease);
    p.add(pg::text_array_literal(idems)).add(pg::int_array_literal(amounts));
    p.add(pg::text_array_literal(paths))
        .add(pg::text_array_literal(bodies))
        .add(pg::text_array_literal(customers));
    p.add(static_cast<std::int64_t>(rs[0].same_key_window.count()));
    auto r = co_await pg::exec_pooled(pool_, lease_record_sql, std::move(p));
    if (!r) co_return r.err();
    if (r->size() != rs.size())
        throw pg::column_error("cg_vault_lease_record returned " + std::to_string(r->size()) + " rows for " +
                               std::to_string(rs.size()));
    for (std::size_t i = 0; i < r->size(); ++i) {
        auto o = parse_reserve_outcome(r->get<std::string_view>(i, 1));
        if (!o) throw pg::column_error("cg_vault_lease_record: unknown outcome " + r->get<std::string>(i, 1));
        reserve_result one;
        one.outcome = *o;
        one.state = r->get<std::optional<std::string>>(i, 2).value_or("");
        out.push_back(std::move(one));
    }
    co_return out;
}

net::awaitable<result<std::int64_t>> store::lease_return(std::string key_id, std::int64_t lease,
                                                         std::string holder, std::int64_t cents, bool close) {
    auto r = co_await pg::exec_pooled(pool_, lease_return_sql,
                                      pg::params(std::move(key_id), lease, std::move(holder), cents, close));
    if (!r) co_return r.err();
    if (r->size() != 1) throw pg::column_error("cg_vault_lease_return returned no row");
    co_return r->get<std::int64_t>(0, 0);
}

net::awaitable<result<std::vector<store::open_lease>>> store::open_leases(std::string key_id) {
    auto r = co_await pg::exec_pooled(pool_, open_leases_sql, pg::params(std::move(key_id)));
    if (!r) co_return r.err();
    std::vector<open_lease> out;
    for (std::size_t i = 0; i < r->size(); ++i) {
        open_lease l;
        l.id = r->get<std::int64_t>(i, 0);
        l.holder = r->get<std::string>(i, 1);
        l.granted_cents = r->get<std::int64_t>(i, 2);
        l.spent_cents = r->get<std::int64_t>(i, 3);
        l.taken_at = r->get<pg::timestamp>(i, 4);
        l.expires_at = r->get<pg::timestamp>(i, 5);
        l.expired = r->get<bool>(i, 6);
        out.push_back(std::move(l));
    }
    co_return out;
}

net::awaitable<result<std::int64_t>> store::expired_lease_cents() {
    auto r = co_await pg::exec_pooled(pool_, expired_lease_cents_sql, pg::params());
    if (!r) co_return r.err();
    if (r->size() != 1) throw pg::column_error("expired lease cents: no row");
    co_return r->get<std::int64_t>(0, 0);
}

net::awaitable<result<std::optional<store::forfeited>>> store::forfeit_lease(std::string key_id,
                                                                             std::int64_t lease,
                                                                             std::int64_t keep_cents,
                                                                             bool force) {
    auto conn = co_await pool_->acquire();
    if (!conn) co_return conn.err();
    auto& c = **conn;
    if (auto b = co_await c.execute("BEGIN"); !b) co_return b.err();
    if (auto k = co_await c.query(forfeit_lock_key_sql, key_id); !k) co_return k.err();
    auto l = co_await c.query(forfeit_lock_lease_sql, lease, key_id);
    if (!l) co_return l.err();
    if (l->empty() || (!l->get<bool>(0, 1) && !force)) {
        // Closed, or renewed (so its holder is alive) since it was read: nothing forfeited.
        if (auto e = co_await c.execute("ROLLBACK"); !e) co_return e.err();
        co_return std::optional<forfeited>();
    }
    const std::int64_t held = l->get<std::int64_t>(0, 0);
    auto r = co_await c.query(forfeit_sql, lease, keep_cents);
    if (!r) co_return r.err();
    if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
    auto back = r->get<std::optional<std::int64_t>>(0, 0);
    if (!back) co_return std::optional<forfeited>();
    forfeited f;
    f.given_back_cents = *back;
    f.kept_cents = held - *back;  // what it held under the lock, less what went back
    co_return std::optional<forfeited>(f);
}

}  // namespace cg::vault
