// vault::store: what follows a settled reservation — a payment still in flight when its create was
// answered (followed until Stripe says how it ended), a cancel of its intent through the proxy (released at
// once), and refunds (recorded; cap room back only under the key's refunds_reopen_cap). The rest of the
// store is in store.cpp.
#include "pg/rows.hpp"
#include "vault/store.hpp"

namespace cg::vault {
namespace {

const std::string mark_in_flight_sql =
    "UPDATE vault_spend SET settled_status = $3 WHERE vault_key_id = $1 AND idempotency_key = $2 "
    "AND state <> 'released'";

const std::string in_flight_due_sql =
    "SELECT vault_key_id, idempotency_key, coalesce(stripe_object_id, ''), settled_status, "
    "(SELECT coalesce(k.stripe_account, '') FROM vault_keys k WHERE k.id = vault_spend.vault_key_id) "
    "FROM vault_spend "
    "WHERE state = 'settled' AND settled_status IS NOT NULL "
    "AND coalesce(in_flight_checked_at, reserved_at) < now() - $1::bigint * interval '1 millisecond' "
    "ORDER BY coalesce(in_flight_checked_at, reserved_at) LIMIT $2::int";

// The intent's own reservation: settled with it, or with no object recorded (a 402 records none).
const std::string owns_intent_sql =
    "SELECT count(*) FROM vault_spend WHERE vault_key_id = $1 AND idempotency_key = $2 "
    "AND (stripe_object_id IS NULL OR stripe_object_id = $3)";
const std::string release_canceled_sql =
    "UPDATE vault_spend SET state = 'released', settled_status = NULL, next_resolve_at = NULL, "
    "in_flight_checked_at = now(), last_error = $4, refunded_cents = 0, reopened_cents = 0 "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state <> 'released' "
    "AND (stripe_object_id IS NULL OR stripe_object_id = $3)";

// Each only from a settled row still in flight: a second answer (two resolver passes, a retry) finds the
// row ended and changes nothing, so the cap room comes back once.
const std::string in_flight_succeeded_sql =
    "UPDATE vault_spend SET settled_status = NULL, in_flight_checked_at = now() "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state = 'settled' AND settled_status IS NOT NULL";
const std::string in_flight_failed_sql =
    "UPDATE vault_spend SET state = 'released', settled_status = NULL, in_flight_checked_at = now(), "
    "last_error = $3, refunded_cents = 0, reopened_cents = 0 "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state = 'settled' AND settled_status IS NOT NULL";
const std::string in_flight_still_sql =
    "UPDATE vault_spend SET in_flight_checked_at = now() "
    "WHERE vault_key_id = $1 AND idempotency_key = $2 AND state = 'settled' AND settled_status IS NOT NULL";

// The cap room a reservation's refunds reopen, as its refunded amount moves from s.refunded_cents to
// NEW: a rise reopens the rise if the key's policy says so now, and nothing otherwise; room reopened before
// stays reopened whatever the policy became since (spend made under it is not turned into an overspend
// after the fact); a fall (a refund that failed or was canceled gives its amount back) takes the fall out
// of the reopened room (as if the refund given back had reopened room: the cap never keeps room that no
// standing refund reopened).
#define CG_REOPENED(NEW)                                    \
    "CASE WHEN " NEW " >= s.refunded_cents THEN least(" NEW \
    ", s.reopened_cents + CASE WHEN "                       \
    "k.refunds_reopen_cap THEN " NEW                        \
    " - s.refunded_cents ELSE 0 END) "                      \
    "ELSE greatest(0, s.reopened_cents - (s.refunded_cents - " NEW ")) END"

#define CG_DIRECT_REFUNDED "greatest(s.refunded_cents, least($3::bigint, s.amount_cents))"
const std::string refund_sql =
    "UPDATE vault_spend s SET refunded_cents = " CG_DIRECT_REFUNDED ", reopened_cents = " CG_REOPENED(
        CG_DIRECT_REFUNDED) " FROM vault_keys k WHERE k.id = s.vault_key_id AND s.vault_key_id = $1 "
                            "AND s.idempotency_key = $2 AND s.state = 'settled' RETURNING s.reopened_cents";
#undef CG_DIRECT_REFUNDED

// Inside a transaction holding the payment's refund lock (billing/store/settlement_store.cpp takes the same
// one while it records a refund fact), so the total read includes every refund fact committed before.
const std::string refund_lock_sql = "SELECT pg_advisory_xact_lock(hashtextextended('cg-refund:' || $1, 0))";
#define CG_TOTAL_REFUNDED "least(s.amount_cents, t.total)"
const std::string refund_by_object_sql =
    "UPDATE vault_spend s SET refunded_cents = " CG_TOTAL_REFUNDED ", reopened_cents = " CG_REOPENED(
        CG_TOTAL_REFUNDED) " FROM vault_keys k, (SELECT cg_refunded_cents(nullif($1::text, ''), "
                           "nullif($2::text, '')) AS total) t WHERE k.id = s.vault_key_id "
                           "AND s.stripe_object_id IN (nullif($1::text, ''), nullif($2::text, '')) "
                           "AND s.state = 'settled' RETURNING s.vault_key_id, s.idempotency_key, "
                           "s.refunded_cents, s.reopened_cents";
#undef CG_TOTAL_REFUNDED
#undef CG_REOPENED

const std::string refund_policy_sql = "UPDATE vault_keys SET refunds_reopen_cap = $2 WHERE id = $1";

}  // namespace

net::awaitable<result<bool>> store::mark_in_flight(std::string key_id, std::string idem, std::string status) {
    auto r = co_await pg::exec_pooled(pool_, mark_in_flight_sql,
                                      pg::params(std::move(key_id), std::move(idem), std::move(status)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<std::vector<store::in_flight_row>>> store::in_flight_due(
    std::chrono::milliseconds recheck, int limit) {
    auto r = co_await pg::exec_pooled(pool_, in_flight_due_sql,
                                      pg::params(static_cast<std::int64_t>(recheck.count()), limit));
    if (!r) co_return r.err();
    std::vector<in_flight_row> out;
    for (std::size_t i = 0; i < r->size(); ++i)
        out.push_back({r->get<std::string>(i, 0), r->get<std::string>(i, 1), r->get<std::string>(i, 2),
                       r->get<std::string>(i, 3), r->get<std::optional<std::string>>(i, 4).value_or("")});
    co_return out;
}

net::awaitable<result<bool>> store::end_in_flight(std::string key_id, std::string idem, in_flight_end how,
                                                  std::string why) {
    const std::string& sql = how == in_flight_end::succeeded ? in_flight_succeeded_sql
                             : how == in_flight_end::failed  ? in_flight_failed_sql
                                                             : in_flight_still_sql;
    auto p = pg::params(std::move(key_id), std::move(idem));
    if (how == in_flight_end::failed) p.add(std::move(why));
    auto r = co_await pg::exec_pooled(pool_, sql, std::move(p));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bool>> store::owns_intent(std::string key_id, std::string idem, std::string intent_id) {
    auto r = co_await pg::exec_pooled(pool_, owns_intent_sql,
                                      pg::params(std::move(key_id), std::move(idem), std::move(intent_id)));
    if (!r) co_return r.err();
    co_return r->get<std::int64_t>(0, 0) > 0;
}

net::awaitable<result<bool>> store::release_canceled(std::string key_id, std::string idem,
                                                     std::string intent_id, std::string why) {
    auto r = co_await pg::exec_pooled(
        pool_, release_canceled_sql,
        pg::params(std::move(key_id), std::move(idem), std::move(intent_id), std::move(why)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<std::optional<std::int64_t>>> store::apply_refund(std::string key_id, std::string idem,
                                                                        std::int64_t refunded_cents) {
    auto r = co_await pg::exec_pooled(pool_, refund_sql,
                                      pg::params(std::move(key_id), std::move(idem), refunded_cents));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<std::int64_t>();
    co_return std::optional<std::int64_t>(r->get<std::int64_t>(0, 0));
}

net::awaitable<result<std::vector<store::refund_applied>>> store::apply_refund_by_object(
    std::string charge_id, std::string payment_intent_id) {
    const std::string payment = charge_id.empty() ? payment_intent_id : charge_id;
    std::vector<refund_applied> out;
    if (payment.empty()) co_return out;
    auto conn = co_await pool_->acquire();
    if (!conn) co_return conn.err();
    auto& c = **conn;
    if (auto b = co_await c.execute("BEGIN"); !b) co_return b.err();
    if (auto l = co_await c.query(refund_lock_sql, payment); !l) co_return l.err();
    auto r = co_await c.query(refund_by_object_sql, std::move(charge_id), std::move(payment_intent_id));
    if (!r) co_return r.err();
    if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
    for (std::size_t i = 0; i < r->size(); ++i)
        out.push_back({r->get<std::string>(i, 0), r->get<std::string>(i, 1), r->get<std::int64_t>(i, 2),
                       r->get<std::int64_t>(i, 3)});
    co_return out;
}

net::awaitable<result<bool>> store::set_refunds_reopen_cap(std::string key_id, bool reopen) {
    auto r = co_await pg::exec_pooled(pool_, refund_policy_sql, pg::params(std::move(key_id), reopen));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

}  // namespace cg::vault
