// The ledger's SQL (billing/store/ledger.cpp, billing/store/ledger_runners.cpp): every statement the ledger
// sends, and the column positions its decoders read. Internal to the ledger.
#pragma once

#include <string>

namespace cg::billing::ledger_sql {

// Positions of the record columns (CG_RECORD_COLUMNS below), in order; the first stored_count are the
// stored columns (CG_STORED_COLUMNS).
namespace record_col {
enum : int {
    key,
    customer_id,
    billing_period,
    amount_cents,
    currency,
    stripe_customer_id,
    status,
    charge_id,
    key_generation,
    indeterminate_since,
    lease_until,
    first_stripe_attempt_at,
    stripe_attempts,
    stripe_account,
    stored_count,
    lease_remaining_ms = stored_count,
    lease_epoch,
    count
};
}  // namespace record_col

// Every statement that reads a whole row selects these columns in this order (decode_record reads them).
// record_col::lease_remaining_ms is the lease's remaining time by the database clock (NULL without a lease, 0
// once expired), so a "lease held" requeue can wait exactly as long as the holder may still be working;
// record_col::lease_epoch the lease epoch (the lease token, see ledger.hpp).
#define CG_STORED_COLUMNS                                                                               \
    "key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, status, charge_id, " \
    "key_generation, indeterminate_since, lease_until, first_stripe_attempt_at, stripe_attempts, "      \
    "stripe_account"
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
inline const std::string preflight_insert_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, "
    "status, lease_until, lease_epoch, nsq_message_id, nsq_attempts, stripe_attempts, first_stripe_attempt_at, "
    "last_stripe_attempt_at, description, payment_method, off_session, key_namespace, stripe_account) "
    "VALUES ($1, $2, $3, $4, $5, $6, 'pending', " CG_LEASE_END("$7") ", 1, $8, $9, 1, now(), now(), $10::text, "
    "$11::text, $12::boolean, $13::text, nullif($14::text, '')) "
    "ON CONFLICT DO NOTHING RETURNING " CG_RECORD_COLUMNS;

// The row that made the insert conflict: by key first; else the (customer_id, billing_period, stripe_account)
// row under another key. The account travels as text, '' for the platform (NULL in the row).
inline const std::string preflight_existing_sql =
    "SELECT " CG_RECORD_COLUMNS
    " FROM billing_records "
    "WHERE key = $1::text OR (customer_id = $2::text AND billing_period = $3::text "
    "AND stripe_account IS NOT DISTINCT FROM nullif($4::text, '')) "
    "ORDER BY key = $1::text DESC LIMIT 1";

// preflight_existing_sql for the conflicting rows a batch statement could not read (preflight_batch_sql), as
// one statement: the last column is the 1-based position of the request in the arrays.
inline const std::string preflight_existing_batch_sql =
    "SELECT e.*, v.i FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS v(key, "
    "customer_id, billing_period, stripe_account, i) CROSS JOIN LATERAL (SELECT " CG_RECORD_COLUMNS
    " FROM billing_records r WHERE r.key = v.key OR (r.customer_id = v.customer_id AND r.billing_period = "
    "v.billing_period AND r.stripe_account IS NOT DISTINCT FROM nullif(v.stripe_account, '')) "
    "ORDER BY r.key = v.key DESC LIMIT 1) AS e";

inline const std::string find_sql = "SELECT " CG_RECORD_COLUMNS " FROM billing_records WHERE key = $1";

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
inline const std::string take_sql =
    "WITH taken AS (UPDATE billing_records SET lease_until = " CG_LEASE_END("$2") ", "
    "lease_epoch = lease_epoch + 1, nsq_message_id = $3, nsq_attempts = $4 "
    "WHERE key = $1 AND status = 'pending' AND (lease_until IS NULL OR lease_until < now()) "
    "AND clock_timestamp() < $5::timestamptz RETURNING " CG_RECORD_COLUMNS ") "
    "SELECT " CG_RECORD_COLUMNS ", clock_timestamp() >= $5::timestamptz FROM (VALUES (1)) AS one(x) "
    "LEFT JOIN taken ON true";
// The late flag: right after the record columns.
constexpr int take_late_column = record_col::count;

// Renewals run while a Stripe call is awaited, so they also say "a call under this generation is in flight"
// (last_stripe_attempt_at, see bump_sql).
inline const std::string renew_sql =
    "WITH renewed AS (UPDATE billing_records SET lease_until = " CG_LEASE_END("$3") ", "
    "lease_epoch = lease_epoch + 1, last_stripe_attempt_at = now() "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2 AND clock_timestamp() < $4::timestamptz "
    "RETURNING lease_epoch) "
    "SELECT (SELECT lease_epoch FROM renewed), clock_timestamp() >= $4::timestamptz";

inline const std::string attempt_sql =
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
inline const std::string settle_sql =
    "UPDATE billing_records SET status = $2::text, charge_id = coalesce($3::text, charge_id), "
    "last_error = coalesce($4::text, last_error), lease_until = NULL, lease_epoch = lease_epoch + 1, "
    "payment_intent_id = coalesce($5::text, payment_intent_id) "
    "WHERE key = $1 AND status = 'pending'";

// Group commit (ledger_batch.hpp): the pre-flight for many rows at once, the rows as arrays, in one statement
// (one transaction for the batch). A row the statement's snapshot already holds — by key, or by
// (customer_id, billing_period, stripe_account), exactly the two unique constraints a new row can meet — is
// read (`found`, preflight_existing_sql per row) and not inserted: the insert could only conflict with it,
// and a conflicting insert costs the database about twice the read (a replayed day is all conflicts). The
// others are inserted in key order, writing exactly what preflight_insert_sql writes per row. A row that is
// neither found nor inserted conflicted with a row committed after the statement's snapshot was taken (an
// insert it waited for): invisible to this statement, its caller's row is read by a later one
// (preflight_existing_batch_sql), as after a single insert.
// Each result row: the record columns (decode_record; for an inserted row the remaining-lease column is NULL:
// it is exactly the lease it was given), then the 1-based position of the request in the arrays (found rows;
// NULL for an inserted row, which is known by its key), then whether the row was inserted.
inline const std::string preflight_batch_sql =
    "WITH v AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], "
    "$6::text[], $7::int8[], $8::text[], $9::int4[], $10::text[], $11::text[], $12::boolean[], $13::text[], "
    "$14::text[]) WITH ORDINALITY AS v(key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, lease_ms, nsq_message_id, nsq_attempts, description, payment_method, off_session, "
    "key_namespace, stripe_account, i)), "
    "found AS MATERIALIZED (SELECT e.*, v.i FROM v CROSS JOIN LATERAL (SELECT " CG_RECORD_COLUMNS
    " FROM billing_records r WHERE r.key = v.key OR (r.customer_id = v.customer_id AND r.billing_period = "
    "v.billing_period AND r.stripe_account IS NOT DISTINCT FROM nullif(v.stripe_account, '')) "
    "ORDER BY r.key = v.key DESC LIMIT 1) AS e), "
    "ins AS (INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, status, lease_until, lease_epoch, nsq_message_id, nsq_attempts, stripe_attempts, "
    "first_stripe_attempt_at, last_stripe_attempt_at, description, payment_method, off_session, key_namespace, "
    "stripe_account) "
    "SELECT v.key, v.customer_id, v.billing_period, v.amount_cents, v.currency, v.stripe_customer_id, "
    "'pending', " CG_LEASE_END("v.lease_ms") ", 1, v.nsq_message_id, v.nsq_attempts, 1, now(), now(), "
    "v.description, v.payment_method, v.off_session, v.key_namespace, nullif(v.stripe_account, '') "
    "FROM v WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.i = v.i) ORDER BY v.i "
    "ON CONFLICT DO NOTHING RETURNING " CG_STORED_COLUMNS ", lease_epoch) "
    "SELECT found.*, false FROM found "
    "UNION ALL SELECT " CG_STORED_COLUMNS ", NULL::bigint, lease_epoch, NULL::bigint, true FROM ins";
// The request's position (found rows) and the inserted flag: right after the record columns.
constexpr int preflight_batch_index_column = record_col::count;
constexpr int preflight_batch_inserted_column = record_col::count + 1;

// settle_sql per row; RETURNING names the rows that were pending (each caller's `true`).
inline const std::string settle_batch_sql =
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
inline const std::string indeterminate_sql =
    "WITH held AS (SELECT lease_epoch = $2::bigint AS ours FROM billing_records "
    "WHERE key = $1 AND status = 'pending' FOR UPDATE) "
    "UPDATE billing_records SET indeterminate_since = coalesce(indeterminate_since, now()), last_error = $3, "
    "lease_until = CASE WHEN held.ours THEN now() - interval '1 millisecond' ELSE lease_until END, "
    "lease_epoch = CASE WHEN held.ours THEN lease_epoch + 1 ELSE lease_epoch END "
    "FROM held WHERE key = $1 AND status = 'pending' RETURNING held.ours";

inline const std::string release_sql =
    "UPDATE billing_records SET last_error = $3, lease_until = now() - interval '1 millisecond', "
    "lease_epoch = lease_epoch + 1 "
    "WHERE key = $1 AND status = 'pending' AND lease_epoch = $2";

// A new generation only while we hold the lease, from the generation we searched for, and only once no call
// under it has shown life for $4 ms (last_stripe_attempt_at: an attempt recorded, a renewal, or an in-flight
// note from a worker that lost its lease). Returns (new generation, NULL) when bumped, (NULL, ms still to
// wait) when a call may still be in flight, (NULL, NULL) when the lease or the generation moved.
inline const std::string bump_sql =
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
inline const std::string in_flight_sql =
    "UPDATE billing_records SET last_stripe_attempt_at = now() "
    "WHERE key = $1 AND status = 'pending' AND key_generation = $2";

// A reopen's record in billing_retries, from the CTEs `prev` (the row as it was, with its key, status, ids
// and last_error) and `reopened` (its key_generation now); the statement goes on with the two values left,
// requested_by and reason, then FROM. Constant-initialized: other translation units' statics build
// statements from it.
inline constexpr const char* retry_log_insert =
    "INSERT INTO billing_retries (key, generation, previous_status, previous_charge_id, "
    "previous_payment_intent_id, previous_error, requested_by, reason) "
    "SELECT prev.key, reopened.key_generation, prev.status, prev.charge_id, prev.payment_intent_id, "
    "prev.last_error, ";

// The old status comes from the locked read (RETURNING shows only new values). A payment that failed after
// processing leaves the row for billing_retries, as a declined row's does on a retry (retry_store.hpp): the
// new generation's call may be answered with it (a failover lost the bump that had used that generation
// already), and the charge fsm then knows it for an earlier life's.
inline const std::string reopen_sql =
    "WITH prev AS (SELECT key, status, charge_id, payment_intent_id, last_error FROM billing_records "
    "WHERE key = $1 AND status IN ('failed', 'cap_blocked', 'failed_after_processing') FOR UPDATE), "
    "reopened AS (UPDATE billing_records b SET status = 'pending', "
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
    "FROM prev WHERE b.key = $1 RETURNING prev.status, b.key_generation), "
    "logged AS (" +
    std::string(retry_log_insert) +
    "'dead-letter replay', coalesce(nullif($2::text, ''), 'replay') FROM prev, reopened "
    "WHERE prev.status = 'failed_after_processing' ON CONFLICT (key, generation) DO NOTHING) "
    "SELECT status FROM reopened";

inline const std::string processing_sql =
    "UPDATE billing_records SET status = 'processing', charge_id = coalesce($2::text, charge_id), "
    "payment_intent_id = coalesce($3::text, payment_intent_id), stripe_status = $4::text, "
    "stripe_status_at = now(), processing_since = now(), polled_at = NULL, nsq_topic = $5::text, "
    "nsq_channel = $6::text, nsq_message_id = $7::text, nsq_attempts = $8::int, raw_body = $9::bytea, "
    "lease_until = NULL, lease_epoch = lease_epoch + 1 WHERE key = $1 AND status = 'pending'";

// Held until the batch's transaction ends: concurrent deliveries of one message insert one letter.
inline const std::string letter_lock_sql =
    "SELECT pg_advisory_xact_lock(hashtextextended('cg_dead_letter:' || $1::text, 0))";
// Inserts the letter, or counts the delivery on the letter already there (a redelivery: no FIN reached
// nsqd). It writes either way, so its commit waits for the synchronous standby and the FIN after it never
// rests on a first commit whose wait was cancelled, which exists on the primary only (a commit that wrote
// nothing returns at once). Affects one row only when it inserted.
inline const std::string letter_insert_sql =
    "WITH again AS (UPDATE dead_letters SET deliveries = deliveries + 1 "
    "WHERE nsq_message_id = $3::text AND reason = $6::text RETURNING 1) "
    "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, billing_key) "
    "SELECT $1::text, $2::text, $3::text, $4::int, $5::bytea, $6::text, $7::text "
    "WHERE NOT EXISTS (SELECT 1 FROM again)";

// Constant-initialized: other translation units' statics build statements from it.
inline constexpr const char* stored_columns = CG_STORED_COLUMNS;

#undef CG_STORED_COLUMNS
#undef CG_RECORD_COLUMNS
#undef CG_LEASE_END

}  // namespace cg::billing::ledger_sql
