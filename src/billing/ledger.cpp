#include "billing/ledger.hpp"

#include <algorithm>
#include <vector>

#include "pg/pipeline.hpp"
#include "pg/rows.hpp"

namespace cg::billing {
namespace {

using ms = std::chrono::milliseconds;

// Every statement that reads a whole row selects these columns in this order (decode_record reads them).
// Column 13 is the lease's remaining time by the database clock (NULL without a lease, 0 once expired), so a
// "lease held" requeue can wait exactly as long as the holder may still be working; column 14 the lease epoch
// (the lease token, see ledger.hpp).
#define CG_STORED_COLUMNS                                                                               \
    "key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, status, charge_id, " \
    "key_generation, indeterminate_since, lease_until, first_stripe_attempt_at, stripe_attempts"
#define CG_RECORD_COLUMNS \
    CG_STORED_COLUMNS     \
    ", greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint, lease_epoch"

// Lease arithmetic on the database clock; the length travels as milliseconds (int8).
#define CG_LEASE_END(p) "now() + " p "::bigint * interval '1 millisecond'"

// The insert also records the first Stripe attempt (what record_attempt does for a recovered row): the row
// is ours and leased the moment it exists, so there is no step — and no wait for a pooled connection —
// between "row written" and "attempt recorded" in which a crash could leave a row that looks untried. It
// also stores every other field the charge needs (description, payment method, off_session) and the key
// namespace, so the sweeper (sweeper.hpp) can charge the row without its message (migration 0011).
const std::string preflight_insert_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, "
    "status, lease_until, lease_epoch, nsq_message_id, nsq_attempts, stripe_attempts, first_stripe_attempt_at, "
    "last_stripe_attempt_at, description, payment_method, off_session, key_namespace) "
    "VALUES ($1, $2, $3, $4, $5, $6, 'pending', " CG_LEASE_END("$7") ", 1, $8, $9, 1, now(), now(), $10::text, "
    "$11::text, $12::boolean, $13::text) "
    "ON CONFLICT DO NOTHING RETURNING " CG_RECORD_COLUMNS;

// The row that made the insert conflict: by key first; else the (customer_id, billing_period) row under
// another key.
const std::string preflight_existing_sql =
    "SELECT " CG_RECORD_COLUMNS
    " FROM billing_records "
    "WHERE key = $1::text OR (customer_id = $2::text AND billing_period = $3::text) "
    "ORDER BY key = $1::text DESC LIMIT 1";

const std::string find_sql = "SELECT " CG_RECORD_COLUMNS " FROM billing_records WHERE key = $1";

// The lease-extending statements (take, renew, record attempt) carry their own deadline, checked by the
// database: `clock_timestamp() < $deadline`, where the deadline is the client's wall clock at send time plus
// the statement's client-side timeout. A statement the client gave up on (timed out, cancelled, its
// connection dropped in a partition) can still reach the server later — TCP retransmits it after a heal, or a
// stalled backend reads it from its socket buffer — and without the check it would extend a lease nobody
// works on. The client abandons only after timeout + cancel_grace, so with the database clock within
// cancel_grace of the client's, such a statement can never take effect after the client saw it fail.
// clock_timestamp() (not now(), the transaction start) is re-read when a row lock wait ends, so a statement
// parked behind a lock is held to the same deadline. Each statement also reports whether it arrived late, so
// a late arrival is a timeout error (the caller requeues) and never reads as "the lease is not ours"; a
// database clock ahead of ours by more than the timeout shows up as such errors in the log, not as silently
// lost leases. The connection side (pg::connection) additionally drops an abandoned connection with an
// abortive close, so the kernel stops retransmitting it at once.
const std::string take_sql =
    "WITH taken AS (UPDATE billing_records SET lease_until = " CG_LEASE_END("$2") ", "
    "lease_epoch = lease_epoch + 1, nsq_message_id = $3, nsq_attempts = $4 "
    "WHERE key = $1 AND status = 'pending' AND (lease_until IS NULL OR lease_until < now()) "
    "AND clock_timestamp() < $5::timestamptz RETURNING " CG_RECORD_COLUMNS ") "
    "SELECT " CG_RECORD_COLUMNS ", clock_timestamp() >= $5::timestamptz FROM (VALUES (1)) AS one(x) "
    "LEFT JOIN taken ON true";
constexpr int take_late_column = 15;  // right after CG_RECORD_COLUMNS (15 columns)

// Renewals run while a Stripe call is awaited, so they also say "a call under this generation is in flight"
// (last_stripe_attempt_at, see bump_sql).
const std::string renew_sql =
    "WITH renewed AS (UPDATE billing_records SET lease_until = " CG_LEASE_END("$3") ", "
    "lease_epoch = lease_epoch + 1, last_stripe_attempt_at = now() "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2 AND clock_timestamp() < $4::timestamptz "
    "RETURNING lease_epoch) "
    "SELECT (SELECT lease_epoch FROM renewed), clock_timestamp() >= $4::timestamptz";

const std::string attempt_sql =
    "WITH attempted AS (UPDATE billing_records SET stripe_attempts = stripe_attempts + 1, "
    "first_stripe_attempt_at = coalesce(first_stripe_attempt_at, now()), last_stripe_attempt_at = now(), "
    "lease_until = " CG_LEASE_END("$3") ", "
    "lease_epoch = lease_epoch + 1 "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2 AND clock_timestamp() < $4::timestamptz "
    "RETURNING key_generation, stripe_attempts, lease_epoch) "
    "SELECT key_generation, stripe_attempts, lease_epoch, clock_timestamp() >= $4::timestamptz "
    "FROM (VALUES (1)) AS one(x) LEFT JOIN attempted ON true";

// Final states drop the lease; last_error keeps the previous one when the new state has none (charged).
// payment_intent_id ($5) is set for events charged through a PaymentIntent.
const std::string settle_sql =
    "UPDATE billing_records SET status = $2::text, charge_id = coalesce($3::text, charge_id), "
    "last_error = coalesce($4::text, last_error), lease_until = NULL, lease_epoch = lease_epoch + 1, "
    "payment_intent_id = coalesce($5::text, payment_intent_id) "
    "WHERE key = $1 AND status = 'pending'";

// Group commit (ledger_batch.hpp): the same two statements for many rows at once, the rows as arrays. The
// insert writes exactly what preflight_insert_sql writes per row, one transaction for the batch; RETURNING
// gives the inserted rows (a conflicting row, by key or by (customer_id, billing_period), is not returned:
// its caller reads the existing row afterwards, as after a single insert). The remaining-lease column is
// left out: for a row just inserted it is exactly the lease it was given (lease_until - now() in the
// inserting transaction).
const std::string preflight_batch_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, "
    "status, lease_until, lease_epoch, nsq_message_id, nsq_attempts, stripe_attempts, first_stripe_attempt_at, "
    "last_stripe_attempt_at, description, payment_method, off_session, key_namespace) "
    "SELECT v.key, v.customer_id, v.billing_period, v.amount_cents, v.currency, v.stripe_customer_id, "
    "'pending', " CG_LEASE_END("v.lease_ms") ", 1, v.nsq_message_id, v.nsq_attempts, 1, now(), now(), "
    "v.description, v.payment_method, v.off_session, v.key_namespace "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::text[], $7::int8[], "
    "$8::text[], $9::int4[], $10::text[], $11::text[], $12::boolean[], $13::text[]) AS v(key, customer_id, "
    "billing_period, amount_cents, currency, stripe_customer_id, lease_ms, nsq_message_id, nsq_attempts, "
    "description, payment_method, off_session, key_namespace) "
    "ON CONFLICT DO NOTHING RETURNING " CG_STORED_COLUMNS ", lease_epoch";
constexpr int preflight_batch_epoch_column = 13;

// settle_sql per row; RETURNING names the rows that were pending (each caller's `true`).
const std::string settle_batch_sql =
    "UPDATE billing_records AS b SET status = v.status, charge_id = coalesce(v.charge_id, b.charge_id), "
    "last_error = coalesce(v.last_error, b.last_error), lease_until = NULL, lease_epoch = b.lease_epoch + 1, "
    "payment_intent_id = coalesce(v.payment_intent_id, b.payment_intent_id) "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) "
    "AS v(key, status, charge_id, last_error, payment_intent_id) "
    "WHERE b.key = v.key AND b.status = 'pending' RETURNING b.key";

// A released lease is set just in the past, so the next take (lease_until < now()) succeeds at once; the
// epoch moves on, so the releasing worker's token no longer renews it.
// The open answer is recorded even when our lease lapsed meanwhile (it steers whoever holds the row to search
// first); only our own lease is released. The row is locked and read first (`held`) because RETURNING sees
// only the new values, and "was the lease ours" is a question about the old epoch.
const std::string indeterminate_sql =
    "WITH held AS (SELECT lease_epoch = $2::bigint AS ours FROM billing_records "
    "WHERE key = $1 AND status = 'pending' FOR UPDATE) "
    "UPDATE billing_records SET indeterminate_since = coalesce(indeterminate_since, now()), last_error = $3, "
    "lease_until = CASE WHEN held.ours THEN now() - interval '1 millisecond' ELSE lease_until END, "
    "lease_epoch = CASE WHEN held.ours THEN lease_epoch + 1 ELSE lease_epoch END "
    "FROM held WHERE key = $1 AND status = 'pending' RETURNING held.ours";

const std::string release_sql =
    "UPDATE billing_records SET last_error = $3, lease_until = now() - interval '1 millisecond', "
    "lease_epoch = lease_epoch + 1 "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2";

// A new generation only while we hold the lease, from the generation we searched for, and only once no call
// under it has shown life for $4 ms (last_stripe_attempt_at: an attempt recorded, a renewal, or an in-flight
// note from a worker that lost its lease). Returns (new generation, NULL) when bumped, (NULL, ms still to
// wait) when a call may still be in flight, (NULL, NULL) when the lease or the generation moved.
const std::string bump_sql =
    "WITH cur AS (SELECT greatest(0, ceil(extract(epoch FROM coalesce(last_stripe_attempt_at, "
    "first_stripe_attempt_at, now() - $4::bigint * interval '1 millisecond') + $4::bigint * interval "
    "'1 millisecond' - now()) * 1000))::bigint "
    "AS wait_ms FROM billing_records "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2 AND key_generation = $3 FOR UPDATE), "
    "bumped AS (UPDATE billing_records b SET key_generation = b.key_generation + 1, indeterminate_since = "
    "NULL "
    "FROM cur WHERE b.key = $1 AND cur.wait_ms = 0 RETURNING b.key_generation) "
    "SELECT (SELECT key_generation FROM bumped), (SELECT wait_ms FROM cur WHERE wait_ms > 0)";

// A worker whose lease was taken over while its Stripe call is still awaited keeps saying so, for its own
// generation only (no lease needed: it moves no state, it only holds back a new generation).
const std::string in_flight_sql =
    "UPDATE billing_records SET last_stripe_attempt_at = now() "
    "WHERE key = $1 AND status = 'pending' AND key_generation = $2";

// The old status comes from the locked read (RETURNING shows only new values).
const std::string reopen_sql =
    "WITH prev AS (SELECT status FROM billing_records WHERE key = $1 "
    "AND status IN ('failed', 'cap_blocked', 'failed_after_processing') FOR UPDATE) "
    "UPDATE billing_records b SET status = 'pending', "
    "indeterminate_since = CASE WHEN prev.status = 'failed_after_processing' THEN NULL "
    "ELSE coalesce(b.indeterminate_since, now()) END, "
    "key_generation = b.key_generation + CASE WHEN prev.status = 'failed_after_processing' THEN 1 ELSE 0 "
    "END, "
    "charge_id = CASE WHEN prev.status = 'failed_after_processing' THEN NULL ELSE b.charge_id END, "
    "payment_intent_id = CASE WHEN prev.status = 'failed_after_processing' THEN NULL "
    "ELSE b.payment_intent_id END, "
    "first_stripe_attempt_at = CASE WHEN prev.status = 'failed_after_processing' THEN now() "
    "ELSE b.first_stripe_attempt_at END, "
    "lease_until = NULL, lease_epoch = b.lease_epoch + 1, last_error = $2 "
    "FROM prev WHERE b.key = $1 RETURNING prev.status";

const std::string processing_sql =
    "UPDATE billing_records SET status = 'processing', charge_id = coalesce($2::text, charge_id), "
    "payment_intent_id = coalesce($3::text, payment_intent_id), stripe_status = $4::text, "
    "stripe_status_at = now(), processing_since = now(), polled_at = NULL, nsq_topic = $5::text, "
    "nsq_channel = $6::text, nsq_message_id = $7::text, nsq_attempts = $8::int, raw_body = $9::bytea, "
    "lease_until = NULL, lease_epoch = lease_epoch + 1 WHERE key = $1 AND status = 'pending'";

// Held until the batch's transaction ends: concurrent deliveries of one message insert one letter.
const std::string letter_lock_sql =
    "SELECT pg_advisory_xact_lock(hashtextextended('cg_dead_letter:' || $1::text, 0))";
const std::string letter_insert_sql =
    "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, billing_key) "
    "SELECT $1::text, $2::text, $3::text, $4::int, $5::bytea, $6::text, $7::text "
    "WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE nsq_message_id = $3::text AND reason = $6::text)";

#undef CG_RECORD_COLUMNS
#undef CG_LEASE_END

std::optional<sys_time> to_sys(std::optional<pg::timestamp> t) {
    if (!t) return std::nullopt;
    return sys_time(*t);
}

}  // namespace

const std::string& stored_record_columns() {
    static const std::string columns = CG_STORED_COLUMNS;
    return columns;
}
#undef CG_STORED_COLUMNS

ledger_record decode_stored_record_columns(const pg::rows& r, std::size_t i) {
    ledger_record rec;
    rec.key = r.get<std::string>(i, 0);
    rec.customer_id = r.get<std::string>(i, 1);
    rec.billing_period = r.get<std::string>(i, 2);
    rec.amount_cents = r.get<std::int64_t>(i, 3);
    rec.currency = r.get<std::string>(i, 4);
    rec.stripe_customer_id = r.get<std::string>(i, 5);
    auto status = parse_record_status(r.get<std::string_view>(i, 6));
    // The CHECK constraint lists the same states: anything else means schema and code disagree.
    if (!status) throw pg::column_error("billing_records.status: unknown value " + r.get<std::string>(i, 6));
    rec.status = *status;
    rec.charge_id = r.get<std::optional<std::string>>(i, 7);
    rec.key_generation = r.get<std::int32_t>(i, 8);
    rec.indeterminate_since = to_sys(r.get<std::optional<pg::timestamp>>(i, 9));
    rec.lease_until = to_sys(r.get<std::optional<pg::timestamp>>(i, 10));
    rec.first_stripe_attempt_at = to_sys(r.get<std::optional<pg::timestamp>>(i, 11));
    rec.stripe_attempts = r.get<std::int32_t>(i, 12);
    return rec;
}

namespace {

ledger_record decode_record(const pg::rows& r, std::size_t i) {
    auto rec = decode_stored_record_columns(r, i);
    if (auto left = r.get<std::optional<std::int64_t>>(i, 13)) rec.lease_remaining = ms(*left);
    rec.lease_epoch = r.get<std::int64_t>(i, 14);
    return rec;
}

std::int64_t millis(ms d) {
    return static_cast<std::int64_t>(d.count());
}

// One statement on a pooled connection. `sql` is one of the statics above (it outlives the call).
net::awaitable<result<pg::rows>> exec(std::shared_ptr<pg::pool> pool, const std::string& sql, pg::params p) {
    return pg::exec_pooled(std::move(pool), sql, std::move(p), pg::acquire_mode::wait_for_server);
}

// One lease-extending statement: as exec(), with the statement's deadline appended as the last parameter
// (see take_sql). The deadline is taken after the connection is acquired, right before sending, from the
// same timeout the connection enforces. Returns the single row the statement always produces, or
// errc::timeout when the database saw the statement only after its deadline and it changed nothing
// (`changed` says whether the row carries the statement's effect; `late_col` is the late flag's column).
net::awaitable<result<pg::rows>> exec_with_deadline(std::shared_ptr<pg::pool> pool, const std::string& sql,
                                                    pg::params p, int late_col) {
    auto c = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!c) co_return c.err();
    auto& conn = **c;
    auto timeout = conn.options().query_timeout;
    // No client timeout (zero) means the client never abandons the statement for time: no deadline worth
    // checking, but the parameter stays, so a far one.
    auto window = timeout > ms::zero() ? timeout : std::chrono::duration_cast<ms>(std::chrono::hours(1));
    auto deadline =
        std::chrono::time_point_cast<std::chrono::microseconds>(std::chrono::system_clock::now() + window);
    p.add(pg::timestamp(deadline));
    auto r = co_await conn.query_with(sql, std::move(p), timeout);
    if (!r) co_return r.err();
    if (r->size() != 1) co_return error(pg::errc::protocol_error, "lease statement: expected one row");
    if (r->is_null(0, 0) && (*r)[0].get<bool>(late_col))
        co_return error(pg::errc::timeout,
                        "the database received the lease statement after its deadline and ignored it "
                        "(a stalled connection, or the database clock ahead of ours)");
    co_return r;
}

// One atomic batch (pipeline mode, one sync): the first failing statement's error, or every result.
net::awaitable<result<std::vector<pg::rows>>> exec_batch(std::shared_ptr<pg::pool> pool, pg::pipeline batch) {
    auto c = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!c) co_return c.err();
    auto r = co_await (*c)->run(batch);
    if (!r) co_return r.err();
    std::vector<pg::rows> out;
    out.reserve(r->size());
    // The failing statement reports its own error; the others pipeline_aborted / rolled_back: report the
    // cause.
    for (auto& one : *r)
        if (!one && one.code() != pg::errc::pipeline_aborted && one.code() != pg::errc::rolled_back)
            co_return one.err();
    for (auto& one : *r) {
        if (!one) co_return one.err();
        out.push_back(std::move(*one));
    }
    co_return out;
}

void add_letter(pg::pipeline& batch, dead_letter l) {
    batch.add(letter_lock_sql, l.nsq_message_id);
    pg::params p;
    p.add(std::move(l.topic)).add(std::move(l.channel)).add(std::move(l.nsq_message_id)).add(l.attempts);
    p.add(std::span(reinterpret_cast<const std::uint8_t*>(l.raw_body.data()), l.raw_body.size()));
    p.add(std::move(l.reason)).add(l.billing_key);
    batch.add_params(letter_insert_sql, std::move(p));
}

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

struct preflight_req {
    new_record rec;
    std::int64_t lease_ms = 0;
};
using preflight_out = std::optional<ledger_record>;  // the inserted row; nullopt: conflict

net::awaitable<result<preflight_out>> preflight_insert_one(std::shared_ptr<pg::pool> pool,
                                                           const preflight_req& q) {
    const auto& e = q.rec.event;
    auto ins = co_await exec(
        pool, preflight_insert_sql,
        pg::params(q.rec.key, e.customer_id, e.billing_period, e.amount_cents, e.currency,
                   e.stripe_customer_id, q.lease_ms, q.rec.nsq_message_id, q.rec.nsq_attempts, e.description,
                   text_or_null(e.payment_method), e.off_session, text_or_null(q.rec.key_namespace)));
    if (!ins) co_return ins.err();
    if (ins->empty()) co_return preflight_out();
    co_return preflight_out(decode_record(*ins, 0));
}

struct preflight_runner {
    static std::string_view key(const preflight_req& q) noexcept { return q.rec.key; }

    static net::awaitable<std::vector<result<preflight_out>>> run(std::shared_ptr<pg::pool> pool,
                                                                  std::vector<preflight_req>& reqs) {
        std::vector<result<preflight_out>> outs;
        outs.reserve(reqs.size());
        if (reqs.size() == 1) {
            outs.push_back(co_await preflight_insert_one(pool, reqs[0]));
            co_return outs;
        }
        auto order = key_order(reqs, key);
        std::vector<std::string> keys, customers, periods, currencies, stripe_customers, message_ids;
        std::vector<std::string> descriptions, off_sessions;
        std::vector<std::optional<std::string>> payment_methods, namespaces;
        std::vector<std::int64_t> amounts, leases, attempts;
        for (auto* v : {&keys, &customers, &periods, &currencies, &stripe_customers, &message_ids,
                        &descriptions, &off_sessions})
            v->reserve(reqs.size());
        payment_methods.reserve(reqs.size());
        namespaces.reserve(reqs.size());
        for (auto* v : {&amounts, &leases, &attempts}) v->reserve(reqs.size());
        for (auto i : order) {
            const auto& q = reqs[i];
            keys.push_back(q.rec.key);
            customers.push_back(q.rec.event.customer_id);
            periods.push_back(q.rec.event.billing_period);
            amounts.push_back(q.rec.event.amount_cents);
            currencies.push_back(q.rec.event.currency);
            stripe_customers.push_back(q.rec.event.stripe_customer_id);
            leases.push_back(q.lease_ms);
            message_ids.push_back(q.rec.nsq_message_id);
            attempts.push_back(q.rec.nsq_attempts);
            descriptions.push_back(q.rec.event.description);
            payment_methods.push_back(text_or_null(q.rec.event.payment_method));
            off_sessions.emplace_back(q.rec.event.off_session ? "t" : "f");
            namespaces.push_back(text_or_null(q.rec.key_namespace));
        }
        pg::params p;
        p.reserve(13);
        p.add(text_array_literal(keys)).add(text_array_literal(customers)).add(text_array_literal(periods));
        p.add(int_array_literal(amounts)).add(text_array_literal(currencies));
        p.add(text_array_literal(stripe_customers)).add(int_array_literal(leases));
        p.add(text_array_literal(message_ids)).add(int_array_literal(attempts));
        p.add(text_array_literal(descriptions)).add(text_array_literal(payment_methods));
        p.add(text_array_literal(off_sessions)).add(text_array_literal(namespaces));
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
        // Keys are unique in a batch and `keys` is sorted: find each returned row's caller by its key.
        for (std::size_t row = 0; row < r->size(); ++row) {
            auto k = r->get<std::string_view>(row, 0);
            auto at = std::lower_bound(keys.begin(), keys.end(), k);
            if (at == keys.end() || *at != k)
                co_return std::vector<result<preflight_out>>(
                    reqs.size(), error(pg::errc::protocol_error, "pre-flight batch returned an unknown key"));
            auto i = order[static_cast<std::size_t>(at - keys.begin())];
            auto rec = decode_stored_record_columns(*r, row);
            rec.lease_epoch = r->get<std::int64_t>(row, preflight_batch_epoch_column);
            rec.lease_remaining = ms(reqs[i].lease_ms);
            rows[i] = std::move(rec);
        }
        for (auto& one : rows) outs.push_back(std::move(one));
        co_return outs;
    }
};

struct settle_req {
    std::string key;
    record_status status;
    std::optional<std::string> charge_id;
    std::optional<std::string> last_error;
    std::optional<std::string> payment_intent_id;
};

net::awaitable<result<bool>> settle_one(std::shared_ptr<pg::pool> pool, const settle_req& q) {
    auto r = co_await exec(
        pool, settle_sql,
        pg::params(q.key, std::string(to_string(q.status)), q.charge_id, q.last_error, q.payment_intent_id));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

struct settle_runner {
    static std::string_view key(const settle_req& q) noexcept { return q.key; }

    static net::awaitable<std::vector<result<bool>>> run(std::shared_ptr<pg::pool> pool,
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
};

}  // namespace

struct ledger::batchers {
    std::shared_ptr<group_commit<preflight_req, preflight_out, preflight_runner>> preflight;
    std::shared_ptr<group_commit<settle_req, bool, settle_runner>> settle;
};

ledger::ledger(std::shared_ptr<pg::pool> pool, ledger_options opts) : pool_(std::move(pool)), opts_(opts) {
    if (!opts_.batch.enabled) return;
    auto options_for = [this](std::string_view statement) {
        auto o = opts_.batch;
        if (!o.linger) o.linger = [linger = linger_] { return *linger; };
        if (opts_.on_batch)
            o.on_statement = [f = opts_.on_batch, statement](std::size_t rows) { f(statement, rows); };
        return o;
    };
    batch_ = std::make_shared<batchers>();
    batch_->preflight = std::make_shared<group_commit<preflight_req, preflight_out, preflight_runner>>(
        pool_, options_for("preflight"));
    batch_->settle =
        std::make_shared<group_commit<settle_req, bool, settle_runner>>(pool_, options_for("settle"));
}

ledger::~ledger() = default;

ledger_batch_counters ledger::batch_counters() const {
    if (!batch_) return {};
    return {batch_->preflight->counters(), batch_->settle->counters()};
}

net::awaitable<result<preflight_result>> ledger::preflight(new_record rec, std::chrono::milliseconds lease) {
    // Kept for the conflict path: the request moves into the batch.
    std::string key = rec.key, customer = rec.event.customer_id, period = rec.event.billing_period;
    preflight_req q{std::move(rec), millis(lease)};
    // (No co_await inside a conditional expression: g++ 12 miscompiles it.)
    result<preflight_out> ins = error(pg::errc::protocol_error, "not run");
    if (batch_)
        ins = co_await batch_->preflight->submit(std::move(q));
    else
        ins = co_await preflight_insert_one(pool_, q);
    if (!ins) co_return ins.err();
    if (*ins) co_return preflight_result{true, std::move(**ins)};
    auto existing =
        co_await exec(pool_, preflight_existing_sql, pg::params(key, std::move(customer), std::move(period)));
    if (!existing) co_return existing.err();
    // Rows are never deleted, so the conflicting row is there; if not, something outside the design did it.
    if (existing->empty())
        co_return error(pg::errc::protocol_error, "pre-flight conflicted but no row matches key " + key);
    co_return preflight_result{false, decode_record(*existing, 0)};
}

net::awaitable<result<std::optional<ledger_record>>> ledger::find(std::string key) {
    auto r = co_await exec(pool_, find_sql, pg::params(std::move(key)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<ledger_record>();
    co_return std::optional<ledger_record>(decode_record(*r, 0));
}

net::awaitable<result<std::optional<ledger_record>>> ledger::take_expired_lease(
    std::string key, std::chrono::milliseconds lease, std::string nsq_message_id, std::int32_t nsq_attempts) {
    auto r = co_await exec_with_deadline(
        pool_, take_sql, pg::params(std::move(key), millis(lease), std::move(nsq_message_id), nsq_attempts),
        take_late_column);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<ledger_record>();
    co_return std::optional<ledger_record>(decode_record(*r, 0));
}

net::awaitable<result<std::optional<lease_token>>> ledger::renew_lease(std::string key, lease_token held,
                                                                       std::chrono::milliseconds lease) {
    auto r =
        co_await exec_with_deadline(pool_, renew_sql, pg::params(std::move(key), held, millis(lease)), 1);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<lease_token>();
    co_return std::optional<lease_token>((*r)[0].get<std::int64_t>(0));
}

net::awaitable<result<std::optional<attempt_record>>> ledger::record_attempt(
    std::string key, lease_token held, std::chrono::milliseconds lease) {
    auto r =
        co_await exec_with_deadline(pool_, attempt_sql, pg::params(std::move(key), held, millis(lease)), 3);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<attempt_record>();
    auto [gen, attempts, epoch] = (*r)[0].as<std::int32_t, std::int32_t, std::int64_t>();
    co_return std::optional<attempt_record>(attempt_record{gen, attempts, epoch});
}

net::awaitable<result<bool>> ledger::settle(std::string key, record_status status,
                                            std::optional<std::string> charge_id,
                                            std::optional<std::string> last_error,
                                            std::optional<dead_letter> letter,
                                            std::optional<std::string> payment_intent_id) {
    if (!letter) {
        settle_req q{std::move(key), status, std::move(charge_id), std::move(last_error),
                     std::move(payment_intent_id)};
        if (batch_) co_return co_await batch_->settle->submit(std::move(q));
        co_return co_await settle_one(pool_, q);
    }
    pg::pipeline batch;
    batch.add(settle_sql, std::move(key), std::string(to_string(status)), std::move(charge_id),
              std::move(last_error), std::move(payment_intent_id));
    add_letter(batch, std::move(*letter));
    auto r = co_await exec_batch(pool_, std::move(batch));
    if (!r) co_return r.err();
    co_return (*r)[0].affected() == 1;
}

net::awaitable<result<bool>> ledger::mark_charged(std::string key, std::string charge_id,
                                                  std::optional<std::string> payment_intent_id) {
    co_return co_await settle(std::move(key), record_status::charged, std::move(charge_id), std::nullopt,
                              std::nullopt, std::move(payment_intent_id));
}

net::awaitable<result<bool>> ledger::mark_declined(std::string key, std::optional<std::string> charge_id,
                                                   std::string last_error,
                                                   std::optional<std::string> payment_intent_id) {
    co_return co_await settle(std::move(key), record_status::declined, std::move(charge_id),
                              std::move(last_error), std::nullopt, std::move(payment_intent_id));
}

net::awaitable<result<bool>> ledger::mark_processing(std::string key, std::optional<std::string> charge_id,
                                                     std::optional<std::string> payment_intent_id,
                                                     std::string stripe_status, dead_letter delivery) {
    pg::params p;
    p.add(std::move(key))
        .add(std::move(charge_id))
        .add(std::move(payment_intent_id))
        .add(std::move(stripe_status));
    p.add(std::move(delivery.topic)).add(std::move(delivery.channel)).add(std::move(delivery.nsq_message_id));
    p.add(delivery.attempts);
    p.add(
        std::span(reinterpret_cast<const std::uint8_t*>(delivery.raw_body.data()), delivery.raw_body.size()));
    auto r = co_await exec(pool_, processing_sql, std::move(p));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bool>> ledger::mark_cap_blocked(std::string key, std::string last_error,
                                                      dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::cap_blocked, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_conflict(std::string key, std::string last_error,
                                                   dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::conflict, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_failed(std::string key, std::string last_error,
                                                 dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::failed, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_indeterminate(std::string key, lease_token held,
                                                        std::string last_error) {
    auto r = co_await exec(pool_, indeterminate_sql, pg::params(std::move(key), held, std::move(last_error)));
    if (!r) co_return r.err();
    co_return !r->empty() && (*r)[0].get<bool>(0);
}

net::awaitable<result<bool>> ledger::release_lease(std::string key, lease_token held,
                                                   std::string last_error) {
    auto r = co_await exec(pool_, release_sql, pg::params(std::move(key), held, std::move(last_error)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bump_result>> ledger::bump_generation(std::string key, lease_token held,
                                                            std::int32_t from_generation,
                                                            std::chrono::milliseconds quiet) {
    auto r = co_await exec(pool_, bump_sql, pg::params(std::move(key), held, from_generation, millis(quiet)));
    if (!r) co_return r.err();
    bump_result out;
    if (!r->empty()) {
        out.generation = (*r)[0].get<std::optional<std::int32_t>>(0);
        if (auto w = (*r)[0].get<std::optional<std::int64_t>>(1)) out.wait = ms(*w);
    }
    co_return out;
}

net::awaitable<result<bool>> ledger::note_in_flight(std::string key, std::int32_t generation) {
    auto r = co_await exec(pool_, in_flight_sql, pg::params(std::move(key), generation));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<std::optional<record_status>>> ledger::reopen_for_replay(std::string key,
                                                                               std::string why) {
    auto r = co_await exec(pool_, reopen_sql, pg::params(std::move(key), std::move(why)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<record_status>();
    co_return parse_record_status(r->get<std::string_view>(0, 0));
}

net::awaitable<result<bool>> ledger::add_dead_letter(dead_letter letter) {
    pg::pipeline batch;
    add_letter(batch, std::move(letter));
    auto r = co_await exec_batch(pool_, std::move(batch));
    if (!r) co_return r.err();
    co_return (*r)[1].affected() == 1;
}

}  // namespace cg::billing
