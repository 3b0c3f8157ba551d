// vault::store: the reservations — the atomic find-or-reserve step (cg_vault_step) and a reservation's state
// changes (settled, released, deferred), the resolver's work list and the count by state. The keys are
// store_keys.cpp, the audit trail store_audit.cpp, what follows a settled reservation store_followup.cpp,
// the cap leases store_lease.cpp.
#include "vault/store.hpp"

#include <algorithm>
#include <tuple>

#include "core/enum_names.hpp"
#include "pg/array_literal.hpp"
#include "pg/rows.hpp"

namespace cg::vault {
namespace {

using ms = std::chrono::milliseconds;

const std::string step_sql =
    "SELECT ord, outcome, state, coalesce(committed_cents, 0), coalesce(cap_cents, 0) "
    "FROM cg_vault_step($1::text, $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], "
    "$8::bigint[], $9::text[], $10::text[], $11::text[], $12::bigint) "
    "ORDER BY ord";

// The state conditions below are written as exclusions (`<>`), not `IN (…)`: an `IN` list implied the
// predicate of vault_spend_counted_idx (on vault_key_id only, dropped by 0009), and a plan on it walked every
// counted row of the key instead of the one primary-key lookup.
const std::string settle_sql =
    "UPDATE vault_spend SET state = 'settled', stripe_object_id = $3, next_resolve_at = NULL, "
    "settled_status = coalesce(nullif($4, ''), settled_status) "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state <> 'settled' AND state <> 'released'";

const std::string settle_many_sql =
    "SELECT ord::bigint FROM cg_vault_settle_many($1::text[], $2::text[], $3::text[]) ORDER BY ord";

const std::string release_sql =
    "UPDATE vault_spend SET state = 'released', last_error = $3, next_resolve_at = NULL "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state <> 'settled' AND state <> 'released'";

const std::string defer_sql =
    "UPDATE vault_spend SET last_error = $3, resolve_attempts = resolve_attempts + 1, "
    "next_resolve_at = now() + $4::bigint * interval '1 millisecond' "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state <> 'settled' AND state <> 'released'";

const std::string due_sql =
    "SELECT vault_key_id, idempotency_key, amount_cents, state, coalesce(request_path, ''), "
    "coalesce(request_body, ''), coalesce(customer, ''), "
    "ceil(extract(epoch FROM now() - reserved_at))::bigint, extract(epoch FROM reserved_at)::bigint, "
    "resolve_attempts, "
    "(SELECT coalesce(k.stripe_account, '') FROM vault_keys k WHERE k.id = vault_spend.vault_key_id) "
    "FROM vault_spend WHERE state IN ('reserved', 'uncertain') AND ("
    "(state = 'uncertain' AND (next_resolve_at IS NULL OR next_resolve_at <= now())) OR "
    "(state = 'reserved' AND (next_resolve_at IS NULL OR next_resolve_at <= now()) "
    " AND updated_at < now() - $1::bigint * interval '1 millisecond')) "
    "ORDER BY next_resolve_at NULLS FIRST, updated_at LIMIT $2::int";

const std::string by_state_sql = "SELECT state, count(*)::bigint FROM vault_spend GROUP BY state";

}  // namespace

std::optional<reserve_outcome> parse_reserve_outcome(std::string_view s) {
    // What cg_vault_step answers per reservation.
    static constexpr enum_names<reserve_outcome, 7> names({{
        {reserve_outcome::reserved, "reserved"},
        {reserve_outcome::rereserved, "rereserved"},
        {reserve_outcome::existing, "existing"},
        {reserve_outcome::cap_exceeded, "cap_exceeded"},
        {reserve_outcome::amount_mismatch, "amount_mismatch"},
        {reserve_outcome::key_expired, "key_expired"},
        {reserve_outcome::key_unusable, "key_unusable"},
    }});
    return names.parse(s);
}

namespace {

// The reservation arrays of cg_vault_step: idems, amounts, paths, bodies, customers.
void add_reservations(pg::params& p, const std::vector<reserve_request>& rs) {
    std::vector<std::optional<std::string>> idems, paths, bodies, customers;
    std::vector<std::int64_t> amounts;
    for (const auto& r : rs) {
        idems.emplace_back(r.idempotency_key);
        paths.emplace_back(r.path);
        bodies.emplace_back(r.body);
        if (r.customer.empty())
            customers.emplace_back(std::nullopt);
        else
            customers.emplace_back(r.customer);
        amounts.push_back(r.amount_cents);
    }
    p.add(pg::text_array_literal(idems))
        .add(pg::int_array_literal(amounts))
        .add(pg::text_array_literal(paths))
        .add(pg::text_array_literal(bodies));
    p.add(pg::text_array_literal(customers));
}

std::vector<reserve_result> decode_reservations(const pg::rows& r, std::size_t expected, const char* fn) {
    if (r.size() != expected)
        throw pg::column_error(std::string(fn) + " returned " + std::to_string(r.size()) + " rows for " +
                               std::to_string(expected));
    std::vector<reserve_result> out;
    out.reserve(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
        auto o = parse_reserve_outcome(r.get<std::string_view>(i, 1));
        if (!o) throw pg::column_error(std::string(fn) + ": unknown outcome " + r.get<std::string>(i, 1));
        reserve_result one;
        one.outcome = *o;
        one.state = r.get<std::optional<std::string>>(i, 2).value_or("");
        one.committed_cents = r.get<std::int64_t>(i, 3);
        one.cap_cents = r.get<std::int64_t>(i, 4);
        out.push_back(std::move(one));
    }
    return out;
}

}  // namespace

net::awaitable<result<std::vector<reserve_result>>> store::step(std::string key_id,
                                                                std::vector<settlement_request> settled,
                                                                std::vector<reserve_request> rs) {
    if (settled.empty() && rs.empty()) co_return std::vector<reserve_result>{};
    std::vector<std::optional<std::string>> idems, states, objects, whys;
    std::vector<std::int64_t> delays;
    for (const auto& s : settled) {
        idems.emplace_back(s.idempotency_key);
        states.emplace_back(s.state);
        if (s.object_id.empty())
            objects.emplace_back(std::nullopt);
        else
            objects.emplace_back(s.object_id);
        if (s.why.empty())
            whys.emplace_back(std::nullopt);
        else
            whys.emplace_back(s.why);
        delays.push_back(static_cast<std::int64_t>(s.retry_in.count()));
    }
    std::int64_t window = rs.empty() ? 0 : static_cast<std::int64_t>(rs[0].same_key_window.count());
    pg::params p;
    p.add(std::move(key_id))
        .add(pg::text_array_literal(idems))
        .add(pg::text_array_literal(states))
        .add(pg::text_array_literal(objects))
        .add(pg::text_array_literal(whys))
        .add(pg::int_array_literal(delays));
    add_reservations(p, rs);
    p.add(window);
    auto r = co_await pg::exec_pooled(pool_, step_sql, std::move(p));
    if (!r) co_return r.err();
    co_return decode_reservations(*r, rs.size(), "cg_vault_step");
}

net::awaitable<result<std::vector<std::size_t>>> store::settle_many(std::vector<keyed_settlement>& s) {
    std::vector<std::size_t> out;
    if (s.empty()) co_return out;
    std::sort(s.begin(), s.end(), [](const keyed_settlement& a, const keyed_settlement& b) {
        return std::tie(a.key_id, a.idempotency_key) < std::tie(b.key_id, b.idempotency_key);
    });
    std::vector<std::optional<std::string>> keys, idems, objects;
    for (const auto& e : s) {
        keys.emplace_back(e.key_id);
        idems.emplace_back(e.idempotency_key);
        objects.emplace_back(e.object_id);
    }
    pg::params p;
    p.add(pg::text_array_literal(keys))
        .add(pg::text_array_literal(idems))
        .add(pg::text_array_literal(objects));
    auto r = co_await pg::exec_pooled(pool_, settle_many_sql, std::move(p));
    if (!r) co_return r.err();
    for (std::size_t i = 0; i < r->size(); ++i) {
        auto ord = r->get<std::int64_t>(i, 0);
        if (ord < 1 || static_cast<std::size_t>(ord) > s.size())
            co_return error(core_errc::out_of_range, "cg_vault_settle_many: ord out of range");
        out.push_back(static_cast<std::size_t>(ord - 1));
    }
    co_return out;
}

net::awaitable<result<bool>> store::settle(std::string key_id, std::string idem, std::string object_id,
                                           std::string in_flight_status) {
    auto r = co_await pg::exec_pooled(
        pool_, settle_sql,
        pg::params(std::move(key_id), std::move(idem), std::move(object_id), std::move(in_flight_status)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bool>> store::release(std::string key_id, std::string idem, std::string why) {
    auto r = co_await pg::exec_pooled(pool_, release_sql,
                                      pg::params(std::move(key_id), std::move(idem), std::move(why)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<void>> store::defer(std::string key_id, std::string idem, std::string why,
                                          ms retry_in) {
    auto r = co_await pg::exec_pooled(pool_, defer_sql,
                                      pg::params(std::move(key_id), std::move(idem), std::move(why),
                                                 static_cast<std::int64_t>(retry_in.count())));
    if (!r) co_return r.err();
    co_return result<void>{};
}

net::awaitable<result<std::vector<spend_row>>> store::due(ms stale_reserved, int limit) {
    // Taken before the statement: PostgreSQL computes the ages (rounded up) at a later moment, so age_seconds
    // plus the time since read_at never makes a row younger than it is.
    auto read_at = std::chrono::steady_clock::now();
    auto r = co_await pg::exec_pooled(pool_, due_sql,
                                      pg::params(static_cast<std::int64_t>(stale_reserved.count()), limit));
    if (!r) co_return r.err();
    std::vector<spend_row> out;
    for (std::size_t i = 0; i < r->size(); ++i) {
        spend_row s;
        s.read_at = read_at;
        s.key_id = r->get<std::string>(i, 0);
        s.idempotency_key = r->get<std::string>(i, 1);
        s.amount_cents = r->get<std::int64_t>(i, 2);
        s.state = r->get<std::string>(i, 3);
        s.path = r->get<std::string>(i, 4);
        s.body = r->get<std::string>(i, 5);
        s.customer = r->get<std::string>(i, 6);
        s.age_seconds = r->get<std::int64_t>(i, 7);
        s.reserved_at_unix = r->get<std::int64_t>(i, 8);
        s.resolve_attempts = r->get<std::int32_t>(i, 9);
        s.stripe_account = r->get<std::optional<std::string>>(i, 10).value_or("");
        out.push_back(std::move(s));
    }
    co_return out;
}

net::awaitable<result<std::vector<std::pair<std::string, std::int64_t>>>> store::reservations_by_state() {
    auto r = co_await pg::exec_pooled(pool_, by_state_sql, pg::params());
    if (!r) co_return r.err();
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (std::size_t i = 0; i < r->size(); ++i)
        out.emplace_back(r->get<std::string>(i, 0), r->get<std::int64_t>(i, 1));
    co_return out;
}

}  // namespace cg::vault
