// vault::store: what follows a settled reservation — a payment still in flight when its create was
// answered (followed until Stripe says how it ended) and refunds (recorded; cap room back only under the
// key's refunds_reopen_cap). The rest of the store is in store.cpp.
#include "pg/rows.hpp"
#include "vault/store.hpp"

namespace cg::vault {
namespace {

const std::string mark_in_flight_sql =
    "UPDATE vault_spend SET settled_status = $3 WHERE vault_key_id = $1 AND idempotency_key = $2 "
    "AND state <> 'released'";

const std::string in_flight_due_sql =
    "SELECT vault_key_id, idempotency_key, coalesce(stripe_object_id, ''), settled_status FROM vault_spend "
    "WHERE state = 'settled' AND settled_status IS NOT NULL "
    "AND coalesce(in_flight_checked_at, reserved_at) < now() - $1::bigint * interval '1 millisecond' "
    "ORDER BY coalesce(in_flight_checked_at, reserved_at) LIMIT $2::int";

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

const std::string refund_sql =
    "UPDATE vault_spend s SET refunded_cents = greatest(s.refunded_cents, least($3::bigint, "
    "s.amount_cents)), "
    "reopened_cents = CASE WHEN k.refunds_reopen_cap "
    "THEN greatest(s.refunded_cents, least($3::bigint, s.amount_cents)) ELSE 0 END "
    "FROM vault_keys k WHERE k.id = s.vault_key_id AND s.vault_key_id = $1 AND s.idempotency_key = $2 "
    "AND s.state = 'settled' RETURNING s.reopened_cents";

const std::string refund_by_object_sql =
    "UPDATE vault_spend s SET refunded_cents = greatest(s.refunded_cents, least($3::bigint, "
    "s.amount_cents)), "
    "reopened_cents = CASE WHEN k.refunds_reopen_cap "
    "THEN greatest(s.refunded_cents, least($3::bigint, s.amount_cents)) ELSE 0 END "
    "FROM vault_keys k WHERE k.id = s.vault_key_id "
    "AND s.stripe_object_id IN (nullif($1::text, ''), nullif($2::text, '')) "
    "AND s.state = 'settled' RETURNING s.vault_key_id, s.idempotency_key, s.reopened_cents";

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
                       r->get<std::string>(i, 3)});
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

net::awaitable<result<std::optional<std::int64_t>>> store::apply_refund(std::string key_id, std::string idem,
                                                                        std::int64_t refunded_cents) {
    auto r = co_await pg::exec_pooled(pool_, refund_sql,
                                      pg::params(std::move(key_id), std::move(idem), refunded_cents));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<std::int64_t>();
    co_return std::optional<std::int64_t>(r->get<std::int64_t>(0, 0));
}

net::awaitable<result<std::vector<store::refund_applied>>> store::apply_refund_by_object(
    std::string charge_id, std::string payment_intent_id, std::int64_t refunded_cents) {
    auto r = co_await pg::exec_pooled(
        pool_, refund_by_object_sql,
        pg::params(std::move(charge_id), std::move(payment_intent_id), refunded_cents));
    if (!r) co_return r.err();
    std::vector<refund_applied> out;
    for (std::size_t i = 0; i < r->size(); ++i)
        out.push_back({r->get<std::string>(i, 0), r->get<std::string>(i, 1), r->get<std::int64_t>(i, 2)});
    co_return out;
}

net::awaitable<result<bool>> store::set_refunds_reopen_cap(std::string key_id, bool reopen) {
    auto r = co_await pg::exec_pooled(pool_, refund_policy_sql, pg::params(std::move(key_id), reopen));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

}  // namespace cg::vault
