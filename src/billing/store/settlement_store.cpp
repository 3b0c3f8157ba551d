#include "billing/store/settlement_store.hpp"

#include <algorithm>

#include "billing/machine/machine.hpp"
#include "pg/rows.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// rest of the billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::billing {
namespace {

#define CG_SETTLE_COLUMNS                                                                       \
    "key, status, amount_cents, charge_id, payment_intent_id, refunded_cents, disputed_cents, " \
    "dispute_status, stripe_account"

const std::string row_by_key_sql =
    "SELECT " CG_SETTLE_COLUMNS " FROM billing_records WHERE key = $1 FOR UPDATE";

// By the charge first, then the PaymentIntent, then the key the object's metadata carries. This only
// finds a candidate: apply_fact moves it only when the fact's ids reach the row's, in its account.
const std::string row_by_ids_sql =
    "SELECT " CG_SETTLE_COLUMNS
    " FROM billing_records WHERE charge_id = $1::text OR payment_intent_id = $2::text OR key = $3::text "
    "ORDER BY charge_id IS NOT DISTINCT FROM $1::text DESC, payment_intent_id IS NOT DISTINCT FROM $2::text "
    "DESC "
    "LIMIT 1 FOR UPDATE";
#undef CG_SETTLE_COLUMNS

// The Stripe status last seen moves only forward in Stripe's time ($8: the fact's unix time), so a stale
// event delivered late does not overwrite a newer status.
const std::string update_row_sql =
    "UPDATE billing_records SET status = $2::text, charge_id = $3::text, payment_intent_id = $4::text, "
    "refunded_cents = $5::bigint, disputed_cents = $6::bigint, dispute_status = $7::text, "
    "stripe_status = CASE WHEN $9::text IS NULL THEN stripe_status "
    "WHEN stripe_status_at IS NULL OR to_timestamp($8::bigint) >= stripe_status_at THEN $9::text "
    "ELSE stripe_status END, "
    "stripe_status_at = CASE WHEN $9::text IS NULL THEN stripe_status_at "
    "ELSE greatest(stripe_status_at, to_timestamp($8::bigint)) END, "
    "last_error = coalesce($10::text, last_error), "
    "polled_at = CASE WHEN $11::boolean THEN now() ELSE polled_at END "
    "WHERE key = $1";

// From the delivery that left the row processing; once per delivery (a redelivered failure, or the poll
// and a webhook saying it both, writes one letter).
const std::string dead_letter_sql =
    "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, billing_key) "
    "SELECT b.nsq_topic, b.nsq_channel, coalesce(b.nsq_message_id, 'settlement-' || b.key), b.nsq_attempts, "
    "b.raw_body, $2::text, b.key FROM billing_records b "
    "WHERE b.key = $1 AND b.raw_body IS NOT NULL AND b.nsq_topic IS NOT NULL AND b.nsq_channel IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.billing_key = b.key AND d.replayed_at IS NULL "
    "AND d.nsq_message_id = coalesce(b.nsq_message_id, 'settlement-' || b.key) "
    "AND d.reason LIKE 'failed after processing%')";

const std::string redelivered_event_sql =
    "UPDATE stripe_webhook_events SET deliveries = deliveries + 1 WHERE id = $1";
const std::string insert_event_sql =
    "INSERT INTO stripe_webhook_events (id, type, created, livemode, object_id, payload, payment_intent_id, "
    "charge_id, billing_key) VALUES ($1, $2, to_timestamp($3), $4, NULLIF($5, ''), $6::jsonb, "
    "NULLIF($7, ''), NULLIF($8, ''), NULLIF($9, '')) ON CONFLICT (id) DO NOTHING RETURNING id";

// A refund fact, recorded by what it names, once per event (inside the event's transaction): the charge's
// cumulative amount_refunded (the newest kept, by the event's time, the larger within one second) or one
// refund by its id (the furthest status kept). The
// advisory lock serialises the refund facts of one payment (and the vault's read of them, vault::store::
// apply_refund_by_object), taken before any row lock.
const std::string refund_lock_sql = "SELECT pg_advisory_xact_lock(hashtextextended('cg-refund:' || $1, 0))";
const std::string charge_refunded_sql =
    "INSERT INTO stripe_charge_refunds (payment, charge_id, payment_intent_id, reported_cents, reported_at) "
    "VALUES (coalesce($1::text, $2::text), $1::text, $2::text, $3::bigint, to_timestamp($4::bigint)) "
    "ON CONFLICT (payment) DO UPDATE SET "
    "reported_cents = CASE WHEN (EXCLUDED.reported_at, EXCLUDED.reported_cents) > "
    "(stripe_charge_refunds.reported_at, stripe_charge_refunds.reported_cents) THEN EXCLUDED.reported_cents "
    "ELSE stripe_charge_refunds.reported_cents END, "
    "reported_at = greatest(stripe_charge_refunds.reported_at, EXCLUDED.reported_at), "
    "charge_id = coalesce(stripe_charge_refunds.charge_id, EXCLUDED.charge_id), "
    "payment_intent_id = coalesce(stripe_charge_refunds.payment_intent_id, EXCLUDED.payment_intent_id)";
const std::string refund_update_sql =
    "INSERT INTO stripe_refunds (id, charge_id, payment_intent_id, amount_cents, status, status_at) "
    "VALUES ($1, $2::text, $3::text, $4::bigint, $5::text, to_timestamp($6::bigint)) "
    "ON CONFLICT (id) DO UPDATE SET "
    "charge_id = coalesce(stripe_refunds.charge_id, EXCLUDED.charge_id), "
    "payment_intent_id = coalesce(stripe_refunds.payment_intent_id, EXCLUDED.payment_intent_id), "
    "status = CASE WHEN cg_refund_status_rank(EXCLUDED.status) > "
    "cg_refund_status_rank(stripe_refunds.status) "
    "THEN EXCLUDED.status ELSE stripe_refunds.status END, "
    "status_at = greatest(stripe_refunds.status_at, EXCLUDED.status_at)";
const std::string refunded_total_sql = "SELECT cg_refunded_cents($1::text, $2::text)";

const std::string event_outcome_sql =
    "UPDATE stripe_webhook_events SET outcome = $2::text, applied_to = $3::text WHERE id = $1";

const std::string events_for_row_sql =
    "SELECT id, payload::text, outcome FROM stripe_webhook_events "
    "WHERE payment_intent_id = $2::text OR charge_id = $3::text OR billing_key = $1::text "
    "ORDER BY created, id";

const std::string due_sql =
    "SELECT key, charge_id, payment_intent_id, stripe_account FROM billing_records WHERE status = "
    "'processing' "
    "AND coalesce(polled_at, processing_since) < now() - $1::bigint * interval '1 millisecond' "
    "ORDER BY coalesce(polled_at, processing_since) LIMIT $2";

const std::string processing_summary_sql =
    "SELECT count(*)::bigint, coalesce(ceil(extract(epoch FROM now() - min(processing_since))), 0)::bigint "
    "FROM billing_records WHERE status = 'processing'";

const std::string deferred_sql =
    "SELECT DISTINCT b.key FROM stripe_webhook_events e JOIN billing_records b "
    "ON b.key = e.applied_to WHERE e.outcome = 'deferred' AND b.status <> 'pending' "
    "AND e.received_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2";

std::optional<std::string> opt(const std::string& s) {
    if (s.empty()) return std::nullopt;
    return s;
}

settlement_row decode_row(const pg::rows& r) {
    settlement_row row;
    auto st = parse_record_status(r.get<std::string_view>(0, 1));
    if (!st) throw pg::column_error("billing_records.status: unknown value " + r.get<std::string>(0, 1));
    row.status = *st;
    row.amount_cents = r.get<std::int64_t>(0, 2);
    row.charge_id = r.get<std::optional<std::string>>(0, 3);
    row.payment_intent_id = r.get<std::optional<std::string>>(0, 4);
    row.refunded_cents = r.get<std::int64_t>(0, 5);
    row.disputed_cents = r.get<std::int64_t>(0, 6);
    row.dispute_status = r.get<std::optional<std::string>>(0, 7);
    row.stripe_account = r.get<std::optional<std::string>>(0, 8).value_or("");
    return row;
}

// A fact's Stripe status worth recording as the payment's (a dispute's status is not the payment's).
std::optional<std::string> payment_status_of(const payment_fact& f) {
    if (!machine::states_payment_status(f.kind)) return std::nullopt;
    return opt(f.status);
}

std::string failure_reason(const payment_fact& f) {
    std::string why(failed_after_processing_reason);
    why += ": " + f.source;
    if (!f.status.empty()) why += " (" + f.status + ")";
    if (!f.failure.empty()) why += ": " + f.failure;
    return why;
}

struct folded {
    row_settlement out;
    std::optional<payment_fact> last_status_fact;  // the newest fact with a payment status
    std::string failure;                           // the reason when failed_now
};

void fold_one(folded& acc, const payment_fact& f, settlement_change& c) {
    c = apply_fact(acc.out.after, f);
    acc.out.after = c.row;
    ++acc.out.facts;
    acc.out.failed_now = acc.out.failed_now || c.failed_now;
    acc.out.charged_now = acc.out.charged_now || c.charged_now;
    acc.out.anomaly = acc.out.anomaly || c.anomaly;
    if (!c.note.empty()) acc.out.note = c.note;
    if (c.failed_now) {
        acc.failure = failure_reason(f);
        acc.out.note = acc.failure;
    }
    bool counts = c.result == settle_result::applied || c.result == settle_result::no_change;
    if (counts && payment_status_of(f) &&
        (!acc.last_status_fact || f.created >= acc.last_status_fact->created))
        acc.last_status_fact = f;
}

// A connection with the transaction open and the row read by key into `acc` (before and after alike), or
// nullopt when no row has the key (that transaction is then already committed).
net::awaitable<result<std::optional<pg::pooled_connection>>> begin_on_row(
    const std::shared_ptr<pg::pool>& pool, const std::string& key, folded& acc) {
    auto conn = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!conn) co_return conn.err();
    auto& c = **conn;
    if (auto b = co_await c.execute("BEGIN"); !b) co_return b.err();
    auto found = co_await c.query(row_by_key_sql, key);
    if (!found) co_return found.err();
    if (found->empty()) {
        if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
        co_return std::optional<pg::pooled_connection>();
    }
    acc.out.key = key;
    acc.out.before = acc.out.after = decode_row(*found);
    co_return std::optional<pg::pooled_connection>(std::move(*conn));
}

bool refund_fact(const payment_fact& f) {
    return machine::names_refund(f.kind);
}

// Records a refund fact by what it names (see refund_update_sql); inside the caller's transaction.
net::awaitable<result<void>> record_refund(pg::connection& c, const payment_fact& f) {
    // Named values only in the co_await expressions (g++ 12 mishandles temporaries made there by a
    // conditional operator).
    const std::string payment = f.charge_id.empty() ? f.payment_intent_id : f.charge_id;
    if (payment.empty()) co_return result<void>();
    if (auto l = co_await c.query(refund_lock_sql, payment); !l) co_return l.err();
    const auto charge = opt(f.charge_id);
    const auto intent = opt(f.payment_intent_id);
    if (f.kind == fact_kind::refunded) {
        const std::int64_t reported = std::max<std::int64_t>(0, f.amount_refunded);
        auto r = co_await c.query(charge_refunded_sql, charge, intent, reported, f.created);
        if (!r) co_return r.err();
    } else {
        const std::int64_t amount = std::max<std::int64_t>(0, f.refund_amount);
        const std::string status = f.status.empty() ? std::string("pending") : f.status;
        auto r = co_await c.query(refund_update_sql, f.refund_id, charge, intent, amount, status, f.created);
        if (!r) co_return r.err();
    }
    co_return result<void>();
}

// A charged row's refunded amount is its payment's refunds as recorded (cg_refunded_cents: each refund
// once, a failed or canceled one given back), whatever the folded events said; inside the transaction.
net::awaitable<result<void>> settle_refunds(pg::connection& c, folded& acc) {
    auto& n = acc.out.after;
    if (n.status != record_status::charged || (!n.charge_id && !n.payment_intent_id))
        co_return result<void>();
    auto r = co_await c.query(refunded_total_sql, n.charge_id, n.payment_intent_id);
    if (!r) co_return r.err();
    n.refunded_cents = std::clamp<std::int64_t>(r->get<std::int64_t>(0, 0), 0, n.amount_cents);
    co_return result<void>();
}

// Writes what the fold decided (row, status last seen, dead letter); inside the caller's transaction.
net::awaitable<result<void>> write_fold(pg::connection& c, const folded& acc, bool polled) {
    const auto& n = acc.out.after;
    const bool wrote_status = acc.last_status_fact.has_value();
    if (n == acc.out.before && !wrote_status && !polled) co_return result<void>();
    std::int64_t at = wrote_status ? acc.last_status_fact->created : 0;
    std::optional<std::string> status =
        wrote_status ? payment_status_of(*acc.last_status_fact) : std::nullopt;
    std::optional<std::string> last_error;
    if (acc.out.failed_now) last_error = acc.failure;
    auto u = co_await c.query(update_row_sql, acc.out.key, std::string(to_string(n.status)), n.charge_id,
                              n.payment_intent_id, n.refunded_cents, n.disputed_cents, n.dispute_status, at,
                              status, last_error, polled);
    if (!u) co_return u.err();
    if (acc.out.failed_now) {
        auto d = co_await c.query(dead_letter_sql, acc.out.key, acc.failure);
        if (!d) co_return d.err();
    }
    co_return result<void>();
}

}  // namespace

net::awaitable<result<event_record_result>> settlement_store::record_event(stripe::webhook_event env,
                                                                           std::string body) {
    event_record_result res;
    auto parsed = parse_event_fact(body);
    bool readable = parsed.has_value();
    if (readable) {
        res.fact = std::move(*parsed);
    } else {
        res.fact.kind = fact_kind::unknown_type;
        res.fact.source = env.type;
    }
    res.fact.created = env.created;
    auto conn = co_await pool_->acquire(pg::acquire_mode::wait_for_server);
    if (!conn) co_return conn.err();
    auto& c = **conn;
    if (auto b = co_await c.execute("BEGIN"); !b) co_return b.err();
    auto ins = co_await c.query(insert_event_sql, env.id, env.type, env.created, env.livemode, env.object_id,
                                body, res.fact.payment_intent_id, res.fact.charge_id, res.fact.billing_key);
    if (!ins) co_return ins.err();
    if (ins->empty()) {
        // A redelivery of an event recorded before. It writes (counts the delivery) so that its commit waits
        // for the synchronous standby: the 2xx must not rest on a first commit whose wait was cancelled,
        // which exists on the primary only (a commit that wrote nothing returns at once).
        if (auto w = co_await c.query(redelivered_event_sql, env.id); !w) co_return w.err();
        if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
        res.duplicate = true;
        co_return res;
    }
    if (readable && refund_fact(res.fact))
        if (auto rr = co_await record_refund(c, res.fact); !rr) co_return rr.err();
    std::optional<std::string> applied_to;
    if (!readable) {
        res.outcome = "unreadable";
    } else if (res.fact.kind == fact_kind::unknown_type) {
        res.outcome = std::string(to_string(settle_result::unknown_type));
    } else {
        auto found = co_await c.query(row_by_ids_sql, opt(res.fact.charge_id),
                                      opt(res.fact.payment_intent_id), opt(res.fact.billing_key));
        if (!found) co_return found.err();
        if (found->empty()) {
            res.outcome = "unknown_object";
        } else {
            folded acc;
            acc.out.key = found->get<std::string>(0, 0);
            acc.out.before = acc.out.after = decode_row(*found);
            settlement_change change;
            fold_one(acc, res.fact, change);
            if (auto sr = co_await settle_refunds(c, acc); !sr) co_return sr.err();
            if (auto w = co_await write_fold(c, acc, false); !w) co_return w.err();
            if (change.result == settle_result::no_change && acc.out.after != acc.out.before)
                change.result = settle_result::applied;
            res.outcome = std::string(to_string(change.result));
            applied_to = acc.out.key;
            res.row = std::move(acc.out);
        }
    }
    if (auto o = co_await c.query(event_outcome_sql, env.id, res.outcome, applied_to); !o) co_return o.err();
    if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
    co_return res;
}

net::awaitable<result<std::optional<row_settlement>>> settlement_store::apply_recorded(std::string key) {
    folded acc;
    auto conn = co_await begin_on_row(pool_, key, acc);
    if (!conn) co_return conn.err();
    if (!*conn) co_return std::optional<row_settlement>();
    auto& c = ***conn;
    auto events =
        co_await c.query(events_for_row_sql, key, acc.out.before.payment_intent_id, acc.out.before.charge_id);
    if (!events) co_return events.err();
    std::vector<std::pair<std::string, std::string>> outcomes;  // (event id, outcome) of deferred events
    for (std::size_t i = 0; i < events->size(); ++i) {
        auto f = parse_event_fact(events->get<std::string_view>(i, 1));
        if (!f || f->kind == fact_kind::unknown_type) continue;
        settlement_change change;
        fold_one(acc, *f, change);
        auto was = events->get<std::optional<std::string>>(i, 2);
        if (!was || *was == "deferred" || *was == "unknown_object" || *was == "unconfirmed")
            outcomes.emplace_back(events->get<std::string>(i, 0), std::string(to_string(change.result)));
    }
    if (auto sr = co_await settle_refunds(c, acc); !sr) co_return sr.err();
    if (auto w = co_await write_fold(c, acc, false); !w) co_return w.err();
    for (const auto& [id, outcome] : outcomes)
        if (auto o = co_await c.query(event_outcome_sql, id, outcome, key); !o) co_return o.err();
    if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
    co_return std::optional<row_settlement>(std::move(acc.out));
}

net::awaitable<result<std::optional<row_settlement>>> settlement_store::apply_retrieved(std::string key,
                                                                                        payment_fact f) {
    folded acc;
    auto conn = co_await begin_on_row(pool_, key, acc);
    if (!conn) co_return conn.err();
    if (!*conn) co_return std::optional<row_settlement>();
    auto& c = ***conn;
    settlement_change change;
    fold_one(acc, f, change);
    if (auto sr = co_await settle_refunds(c, acc); !sr) co_return sr.err();
    if (auto w = co_await write_fold(c, acc, true); !w) co_return w.err();
    if (auto e = co_await c.execute("COMMIT"); !e) co_return e.err();
    co_return std::optional<row_settlement>(std::move(acc.out));
}

net::awaitable<result<std::vector<processing_row>>> settlement_store::due_for_poll(
    std::chrono::milliseconds after, std::int64_t limit) {
    auto r =
        co_await pg::exec_pooled(pool_, due_sql, pg::params(static_cast<std::int64_t>(after.count()), limit),
                                 pg::acquire_mode::wait_for_server);
    if (!r) co_return r.err();
    std::vector<processing_row> out;
    for (std::size_t i = 0; i < r->size(); ++i)
        out.push_back({r->get<std::string>(i, 0), r->get<std::optional<std::string>>(i, 1),
                       r->get<std::optional<std::string>>(i, 2),
                       r->get<std::optional<std::string>>(i, 3).value_or("")});
    co_return out;
}

net::awaitable<result<std::pair<std::int64_t, double>>> settlement_store::processing_summary() {
    auto r =
        co_await pg::exec_pooled(pool_, processing_summary_sql, pg::params(), pg::acquire_mode::fail_fast);
    if (!r) co_return r.err();
    co_return std::pair<std::int64_t, double>(r->get<std::int64_t>(0, 0),
                                              static_cast<double>(r->get<std::int64_t>(0, 1)));
}

net::awaitable<result<std::vector<std::string>>> settlement_store::rows_with_deferred_events(
    std::chrono::milliseconds older_than, std::int64_t limit) {
    auto r = co_await pg::exec_pooled(pool_, deferred_sql,
                                      pg::params(static_cast<std::int64_t>(older_than.count()), limit),
                                      pg::acquire_mode::wait_for_server);
    if (!r) co_return r.err();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(r->get<std::string>(i, 0));
    co_return out;
}

}  // namespace cg::billing
