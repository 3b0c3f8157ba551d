#include "billing/store/correction_ledger.hpp"

#include "billing/store/ledger_runners.hpp"
#include "pg/rows.hpp"

namespace cg::billing {
// Named, not anonymous: the unity build puts this file beside ledger.cpp, whose helpers have the same names.
namespace correction_sql {

net::awaitable<result<pg::rows>> corr_exec(std::shared_ptr<pg::pool> pool, const std::string& sql,
                                           pg::params p) {
    auto c = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!c) co_return c.err();
    auto& conn = **c;
    co_return co_await conn.query_with(sql, std::move(p), conn.options().query_timeout);
}

net::awaitable<result<void>> corr_exec_void(std::shared_ptr<pg::pool> pool, const std::string& sql,
                                            pg::params p) {
    auto r = co_await corr_exec(std::move(pool), sql, std::move(p));
    if (!r) co_return r.err();
    co_return result<void>{};
}

std::int64_t corr_millis(std::chrono::milliseconds d) {
    return static_cast<std::int64_t>(d.count());
}

std::optional<sys_time> corr_to_sys(std::optional<pg::timestamp> t) {
    if (!t) return std::nullopt;
    return sys_time(*t);
}

const std::string admit_sql =
    "SELECT action, detail, epoch, lease_ms, delta FROM cg_correction_admit($1, $2, $3::int, $4::bigint, $5, "
    "$6, "
    "$7, $8::bigint)";

const std::string moves_sql =
    "SELECT part, kind, amount_cents, refund_of, key_generation, status, stripe_object_id, stripe_attempts, "
    "first_stripe_attempt_at, indeterminate_since, "
    "(extract(epoch FROM now() - last_stripe_attempt_at) * 1000)::bigint "
    "FROM billing_correction_moves WHERE correction_key = $1 ORDER BY part";

// The lease renewed and the attempt counted in one statement, only while the epoch is ours.
const std::string attempt_sql =
    "WITH rev AS (UPDATE billing_corrections SET lease_until = now() + $4::bigint * interval '1 ms', "
    "lease_epoch = lease_epoch + 1 WHERE key = $1 AND status = 'pending' AND lease_epoch = $3::bigint "
    "RETURNING lease_epoch), mv AS (UPDATE billing_correction_moves SET stripe_attempts = stripe_attempts + "
    "1, "
    "first_stripe_attempt_at = coalesce(first_stripe_attempt_at, now()), last_stripe_attempt_at = now() "
    "WHERE correction_key = $1 AND part = $2::int AND status = 'pending' AND EXISTS (SELECT 1 FROM rev) "
    "RETURNING 1) SELECT (SELECT lease_epoch FROM rev) WHERE EXISTS (SELECT 1 FROM mv)";

// A renewal while the call is awaited: the lease as record_attempt extends it, the move's last attempt time
// moved on (what bump_sql's quiet waits for), under the deadline $5 (ledger_sql.hpp take_sql). The late flag
// is the second column.
const std::string renew_sql =
    "WITH rev AS (UPDATE billing_corrections SET lease_until = now() + $4::bigint * interval '1 ms', "
    "lease_epoch = lease_epoch + 1 WHERE key = $1 AND status = 'pending' AND lease_epoch = $3::bigint "
    "AND clock_timestamp() < $5::timestamptz RETURNING lease_epoch), "
    "mv AS (UPDATE billing_correction_moves SET last_stripe_attempt_at = now() WHERE correction_key = $1 "
    "AND part = $2::int AND status = 'pending' AND EXISTS (SELECT 1 FROM rev) RETURNING 1) "
    "SELECT (SELECT lease_epoch FROM rev), clock_timestamp() >= $5::timestamptz";

const std::string in_flight_sql =
    "UPDATE billing_correction_moves SET last_stripe_attempt_at = now() WHERE correction_key = $1 "
    "AND part = $2::int AND status = 'pending' AND key_generation = $3::int";

const std::string done_sql =
    "UPDATE billing_correction_moves SET status = 'done', stripe_object_id = $3, payment_intent_id = $4, "
    "indeterminate_since = NULL, last_error = NULL WHERE correction_key = $1 AND part = $2::int "
    "AND status = 'pending'";

const std::string ended_sql =
    "UPDATE billing_correction_moves SET status = $3, last_error = $4 WHERE correction_key = $1 "
    "AND part = $2::int AND status = 'pending'";

const std::string indeterminate_sql =
    "WITH mv AS (UPDATE billing_correction_moves SET indeterminate_since = coalesce(indeterminate_since, "
    "now()), "
    "last_error = $4 WHERE correction_key = $1 AND part = $2::int AND status = 'pending' RETURNING 1) "
    "UPDATE billing_corrections SET lease_until = now() - interval '1 ms', lease_epoch = lease_epoch + 1 "
    "WHERE key = $1 "
    "AND lease_epoch = $3::bigint AND status = 'pending'";

// A released lease is set just in the past (as the ledger's release_sql): expired for the next admit, and the
// time of the release kept as the revision's last activity for the sweeper.
const std::string release_sql =
    "WITH mv AS (UPDATE billing_correction_moves SET last_error = $4 WHERE correction_key = $1 "
    "AND part = $2::int RETURNING 1) "
    "UPDATE billing_corrections SET lease_until = now() - interval '1 ms', lease_epoch = lease_epoch + 1 "
    "WHERE key = $1 "
    "AND lease_epoch = $3::bigint AND status = 'pending'";

const std::string bump_sql =
    "UPDATE billing_correction_moves m SET key_generation = key_generation + 1, indeterminate_since = NULL, "
    "first_stripe_attempt_at = NULL FROM billing_corrections c WHERE c.key = m.correction_key "
    "AND m.correction_key = $1 AND m.part = $2::int AND m.status = 'pending' AND m.key_generation = $4::int "
    "AND c.lease_epoch = $3::bigint AND c.status = 'pending' "
    "AND (m.last_stripe_attempt_at IS NULL OR m.last_stripe_attempt_at < now() - $5::bigint * interval '1 "
    "ms')";

const std::string finish_sql =
    "UPDATE billing_corrections SET status = $2, note = NULLIF($3, ''), lease_until = NULL, "
    "lease_epoch = lease_epoch + 1, finished_at = now() WHERE key = $1 AND status = 'pending'";

}  // namespace correction_sql

std::string correction_key(std::string_view base, std::int32_t revision) {
    return std::string(base) + "-r" + std::to_string(revision);
}

std::string correction_move_key(std::string_view base, std::int32_t revision, std::int32_t part) {
    auto k = correction_key(base, revision);
    if (part > 1) k += "-p" + std::to_string(part);
    return k;
}

net::awaitable<result<correction_admission>> correction_ledger::admit(
    std::string key, std::string base, std::int32_t revision, std::int64_t total_cents, std::string currency,
    std::string body, std::string message_id, std::chrono::milliseconds lease) {
    auto r = co_await correction_sql::corr_exec(pool_, correction_sql::admit_sql,
                                                pg::params(key, base, revision, total_cents, currency, body,
                                                           message_id, correction_sql::corr_millis(lease)));
    if (!r) co_return r.err();
    if (r->size() != 1) co_return error(pg::errc::protocol_error, "cg_correction_admit: expected one row");
    correction_admission a;
    a.action = r->get<std::string>(0, 0);
    a.detail = r->get<std::string>(0, 1);
    a.epoch = r->get<std::int64_t>(0, 2);
    a.lease_remaining = std::chrono::milliseconds(r->get<std::int64_t>(0, 3));
    a.delta = r->get<std::optional<std::int64_t>>(0, 4);
    co_return a;
}

net::awaitable<result<std::vector<correction_move>>> correction_ledger::moves(std::string key) {
    auto r = co_await correction_sql::corr_exec(pool_, correction_sql::moves_sql, pg::params(key));
    if (!r) co_return r.err();
    std::vector<correction_move> out;
    for (std::size_t i = 0; i < r->size(); ++i) {
        correction_move m;
        m.part = r->get<std::int32_t>(i, 0);
        m.kind = r->get<std::string>(i, 1);
        m.amount_cents = r->get<std::int64_t>(i, 2);
        m.refund_of = r->get<std::optional<std::string>>(i, 3);
        m.key_generation = r->get<std::int32_t>(i, 4);
        m.status = r->get<std::string>(i, 5);
        m.stripe_object_id = r->get<std::optional<std::string>>(i, 6);
        m.stripe_attempts = r->get<std::int32_t>(i, 7);
        m.first_stripe_attempt_at = correction_sql::corr_to_sys(r->get<std::optional<pg::timestamp>>(i, 8));
        m.indeterminate_since = correction_sql::corr_to_sys(r->get<std::optional<pg::timestamp>>(i, 9));
        if (auto ms = r->get<std::optional<std::int64_t>>(i, 10))
            m.since_last_attempt = std::chrono::milliseconds(*ms);
        out.push_back(std::move(m));
    }
    co_return out;
}

net::awaitable<result<std::optional<std::int64_t>>> correction_ledger::record_attempt(
    std::string key, std::int32_t part, std::int64_t epoch, std::chrono::milliseconds lease) {
    auto r = co_await correction_sql::corr_exec(
        pool_, correction_sql::attempt_sql, pg::params(key, part, epoch, correction_sql::corr_millis(lease)));
    if (!r) co_return r.err();
    if (r->size() != 1) co_return std::optional<std::int64_t>();
    co_return r->get<std::optional<std::int64_t>>(0, 0);
}

net::awaitable<result<std::optional<std::int64_t>>> correction_ledger::renew_lease(
    std::string key, std::int32_t part, std::int64_t epoch, std::chrono::milliseconds lease) {
    auto r = co_await ledger_detail::exec_with_deadline(
        pool_, correction_sql::renew_sql, pg::params(key, part, epoch, correction_sql::corr_millis(lease)),
        1);
    if (!r) co_return r.err();
    co_return r->get<std::optional<std::int64_t>>(0, 0);
}

net::awaitable<result<void>> correction_ledger::note_in_flight(std::string key, std::int32_t part,
                                                               std::int32_t generation) {
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::in_flight_sql,
                                                      pg::params(key, part, generation));
}

net::awaitable<result<void>> correction_ledger::move_done(std::string key, std::int32_t part,
                                                          std::string object_id,
                                                          std::optional<std::string> payment_intent_id) {
    pg::params p(key, part, object_id);
    if (payment_intent_id)
        p.add(*payment_intent_id);
    else
        p.add(pg::null);
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::done_sql, std::move(p));
}

net::awaitable<result<void>> correction_ledger::move_ended(std::string key, std::int32_t part,
                                                           std::string status, std::string last_error) {
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::ended_sql,
                                                      pg::params(key, part, status, last_error));
}

net::awaitable<result<void>> correction_ledger::move_indeterminate(std::string key, std::int32_t part,
                                                                   std::int64_t epoch,
                                                                   std::string last_error) {
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::indeterminate_sql,
                                                      pg::params(key, part, epoch, last_error));
}

net::awaitable<result<void>> correction_ledger::release(std::string key, std::int32_t part,
                                                        std::int64_t epoch, std::string last_error) {
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::release_sql,
                                                      pg::params(key, part, epoch, last_error));
}

net::awaitable<result<bool>> correction_ledger::bump_generation(std::string key, std::int32_t part,
                                                                std::int64_t epoch,
                                                                std::int32_t from_generation,
                                                                std::chrono::milliseconds quiet) {
    auto r = co_await correction_sql::corr_exec(
        pool_, correction_sql::bump_sql,
        pg::params(key, part, epoch, from_generation, correction_sql::corr_millis(quiet)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<void>> correction_ledger::finish(std::string key, std::string status,
                                                       std::string note) {
    co_return co_await correction_sql::corr_exec_void(pool_, correction_sql::finish_sql,
                                                      pg::params(key, status, note));
}

}  // namespace cg::billing
