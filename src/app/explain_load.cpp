// The reads of `chargeguard explain` (app/explain_load.hpp): the ledger row, the key's dead letters, its
// vault reservations, the period's corrections, the attempts at the charge, a Stripe customer's rows and
// charges, and the recovery search on Stripe. Read-only: nothing here writes anywhere.
#include "app/explain_load.hpp"

#include <simdjson.h>

#include <chrono>
#include <iterator>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "billing/store/retry_store.hpp"
#include "pg/params.hpp"
#include "pg/rows.hpp"
#include "stripe/types.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app::explain_impl {

// Every column as text (NULL stays NULL), in this order.
constexpr const char* explain_columns[] = {"key",
                                           "customer_id",
                                           "billing_period",
                                           "amount_cents",
                                           "currency",
                                           "stripe_customer_id",
                                           "stripe_account",
                                           "status",
                                           "key_generation",
                                           "stripe_attempts",
                                           "lease_until",
                                           "lease_epoch",
                                           "charge_id",
                                           "payment_intent_id",
                                           "last_error",
                                           "indeterminate_since",
                                           "first_stripe_attempt_at",
                                           "last_stripe_attempt_at",
                                           "nsq_message_id",
                                           "nsq_attempts",
                                           "stripe_status",
                                           "stripe_status_at",
                                           "processing_since",
                                           "polled_at",
                                           "refunded_cents",
                                           "disputed_cents",
                                           "dispute_status",
                                           "created_at",
                                           "updated_at"};
constexpr int n_explain_columns = static_cast<int>(std::size(explain_columns));

std::string ledger_sql() {
    std::string s = "SELECT ";
    for (int i = 0; i < n_explain_columns; ++i)
        s += std::string(i ? ", " : "") + explain_columns[i] + "::text";
    s += ", (lease_until IS NOT NULL AND lease_until > now()) AS lease_live FROM billing_records "
         "WHERE key = $1::text OR (customer_id = $2::text AND billing_period = $3::text "
         "AND stripe_account IS NOT DISTINCT FROM nullif($4::text, '')) "
         "ORDER BY (key = $1::text) DESC LIMIT 1";
    return s;
}

std::optional<std::string> opt_text(const pg::rows& r, std::size_t i, int col) {
    if (r.is_null(i, col)) return std::nullopt;
    return std::string(r.text(i, col));
}

net::awaitable<result<pg::rows>> run_query(pg::pool& pool, const std::string& sql, pg::params p) {
    auto c = co_await pool.acquire();
    if (!c) co_return c.err();
    co_return co_await (*c)->query_with(sql, std::move(p), std::chrono::seconds(30));
}

net::awaitable<result<void>> load_ledger(pg::pool& pool, explanation& x, const std::string& stripe_account) {
    auto r = co_await run_query(pool, ledger_sql(), pg::params(x.key, x.customer, x.period, stripe_account));
    if (!r) co_return r.err();
    if (r->empty()) co_return result<void>{};
    ledger_view v;
    for (int c = 0; c < n_explain_columns; ++c) v.fields.push_back({explain_columns[c], opt_text(*r, 0, c)});
    v.lease_live = r->text(0, n_explain_columns) == "t";
    x.row = std::move(v);
    co_return result<void>{};
}

// The string value of "name" in a JSON text that may not be a valid billing event (an invalid event's
// letter), or nothing: the document's own field when it parses as JSON, else the first `"name":"…"` in the
// bytes.
std::optional<std::string> loose_field(const std::string& body, const char* name) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(body).get(doc) == simdjson::SUCCESS) {
        std::string_view v;
        if (doc[name].get_string().get(v) == simdjson::SUCCESS) return std::string(v);
        return std::nullopt;
    }
    auto at = body.find("\"" + std::string(name) + "\"");
    if (at == std::string::npos) return std::nullopt;
    at = body.find_first_not_of(" \t\r\n:", at + std::string_view(name).size() + 2);
    if (at == std::string::npos || body[at] != '"') return std::nullopt;
    auto end = body.find('"', at + 1);
    if (end == std::string::npos) return std::nullopt;
    return body.substr(at + 1, end - at - 1);
}

// The key's dead letters (billing_key), and the letters whose body names the customer and period — an
// invalid event's letter has no key, but what can be read of its body still says whose it was.
net::awaitable<result<void>> load_letters(pg::pool& pool, explanation& x, const std::string& key,
                                          const std::string& customer, const std::string& period,
                                          const std::string& account) {
    auto r = co_await run_query(
        pool,
        "SELECT id::text, reason, received_at::text, replayed_at::text, dismissed_at::text, "
        "billing_key = $1::text, raw_body FROM dead_letters WHERE billing_key = $1::text OR ($2::text <> '' "
        "AND position(convert_to($2::text, 'UTF8') IN raw_body) > 0) ORDER BY id",
        pg::params(key, customer));
    if (!r) co_return r.err();
    for (std::size_t i = 0; i < r->size(); ++i) {
        bool by_key = r->text(i, 5) == "t";
        if (!by_key) {
            auto body = r->get<bytes>(i, 6);
            std::string text(body.begin(), body.end());
            if (loose_field(text, "customer_id") != customer ||
                loose_field(text, "billing_period") != period ||
                loose_field(text, "stripe_account").value_or("") != account)
                continue;
        }
        letter_view l{std::string(r->text(i, 0)), std::string(r->text(i, 1)), std::string(r->text(i, 2)),
                      opt_text(*r, i, 3),         opt_text(*r, i, 4),         by_key ? "key" : "body"};
        x.letters.push_back(std::move(l));
    }
    co_return result<void>{};
}

// --stripe-customer: every ledger row of that Stripe customer in the period (whatever customer id it came
// under), and with `client` every charge Stripe holds for it whose metadata names the period.
net::awaitable<result<void>> load_by_stripe_customer(pg::pool& pool, stripe::client* client, explanation& x,
                                                     const std::string& cus, const std::string& account) {
    stripe_customer_view v;
    v.stripe_customer = cus;
    auto r =
        co_await run_query(pool,
                           "SELECT key, customer_id, status, amount_cents::text, currency, charge_id "
                           "FROM billing_records WHERE stripe_customer_id = $1::text AND billing_period = "
                           "$2::text AND stripe_account IS NOT DISTINCT FROM nullif($3::text, '') "
                           "ORDER BY customer_id, key",
                           pg::params(cus, x.period, account));
    if (!r) co_return r.err();
    for (std::size_t i = 0; i < r->size(); ++i)
        v.rows.push_back({std::string(r->text(i, 0)), std::string(r->text(i, 1)), std::string(r->text(i, 2)),
                          std::string(r->text(i, 3)), std::string(r->text(i, 4)), opt_text(*r, i, 5)});
    if (client) {
        v.stripe_asked = true;
        stripe::list_charges_request q;
        q.customer = cus;
        q.stripe_account = account;
        for (;;) {
            auto page = co_await client->list_charges(q);
            if (!page) co_return page.err();
            for (const auto& ch : page->data) {
                if (stripe::metadata_value(ch.metadata, "billing_period") !=
                    std::optional<std::string_view>(x.period))
                    continue;
                v.charges.push_back(
                    {ch.id, ch.status,
                     std::string(stripe::metadata_value(ch.metadata, "customer_id").value_or("-")),
                     std::to_string(ch.amount), ch.currency});
            }
            if (!page->has_more || page->data.empty()) break;
            q.starting_after = page->data.back().id;
        }
    }
    x.by_stripe_customer = std::move(v);
    co_return result<void>{};
}

net::awaitable<result<void>> load_spend(pg::pool& pool, explanation& x, const std::string& key) {
    auto t = co_await run_query(pool, "SELECT to_regclass('vault_spend') IS NOT NULL", pg::params());
    if (!t) co_return t.err();
    if (t->text(0, 0) != "t") co_return result<void>{};
    // The Stripe idempotency key is the base key, or base-gN for a later generation
    // (billing/machine/key.hpp).
    auto r = co_await run_query(pool,
                                "SELECT vault_key_id, idempotency_key, amount_cents::text, state, "
                                "stripe_object_id, reserved_at::text FROM vault_spend "
                                "WHERE idempotency_key = $1::text OR idempotency_key LIKE $1::text || '-g%' "
                                "ORDER BY reserved_at, idempotency_key",
                                pg::params(key));
    if (!r) co_return r.err();
    std::vector<spend_view> out;
    for (std::size_t i = 0; i < r->size(); ++i)
        out.push_back({std::string(r->text(i, 0)), std::string(r->text(i, 1)), std::string(r->text(i, 2)),
                       std::string(r->text(i, 3)), std::string(r->text(i, 5)), opt_text(*r, i, 4)});
    x.spend = std::move(out);
    co_return result<void>{};
}

// The period's correction revisions and their money moves (migration 0018), by the original's key, and the
// money the ledger has moved for the period. Nothing when the tables do not exist (a schema before 0018).
net::awaitable<result<void>> load_corrections(pg::pool& pool, explanation& x, const std::string& base) {
    auto t = co_await run_query(pool, "SELECT to_regclass('billing_corrections') IS NOT NULL", pg::params());
    if (!t) co_return t.err();
    if (t->text(0, 0) != "t") co_return result<void>{};
    auto r = co_await run_query(pool,
                                "SELECT key, revision::text, total_cents::text, currency, status, "
                                "delta_cents::text, note, started_at::text, finished_at::text "
                                "FROM billing_corrections WHERE base_key = $1::text ORDER BY revision",
                                pg::params(base));
    if (!r) co_return r.err();
    std::vector<revision_view> revs;
    for (std::size_t i = 0; i < r->size(); ++i)
        revs.push_back({std::string(r->text(i, 0)),
                        std::string(r->text(i, 1)),
                        std::string(r->text(i, 2)),
                        std::string(r->text(i, 3)),
                        std::string(r->text(i, 4)),
                        opt_text(*r, i, 5),
                        opt_text(*r, i, 6),
                        opt_text(*r, i, 7),
                        opt_text(*r, i, 8),
                        {}});
    auto m =
        co_await run_query(pool,
                           "SELECT m.correction_key, m.part::text, m.kind, m.amount_cents::text, m.status, "
                           "m.key_generation::text, m.refund_of, m.stripe_object_id, m.payment_intent_id, "
                           "m.last_error FROM billing_correction_moves m JOIN billing_corrections c "
                           "ON c.key = m.correction_key WHERE c.base_key = $1::text "
                           "ORDER BY c.revision, m.part",
                           pg::params(base));
    if (!m) co_return m.err();
    for (std::size_t i = 0; i < m->size(); ++i)
        for (auto& rev : revs)
            if (rev.key == m->text(i, 0))
                rev.moves.push_back({std::string(m->text(i, 1)), std::string(m->text(i, 2)),
                                     std::string(m->text(i, 3)), std::string(m->text(i, 4)),
                                     std::string(m->text(i, 5)), opt_text(*m, i, 6), opt_text(*m, i, 7),
                                     opt_text(*m, i, 8), opt_text(*m, i, 9)});
    if (!revs.empty()) {
        auto n = co_await run_query(pool, "SELECT cg_correction_net_cents($1::text)::text", pg::params(base));
        if (!n) co_return n.err();
        x.net_cents = std::string(n->text(0, 0));
    }
    x.corrections = std::move(revs);
    co_return result<void>{};
}

// How an attempt ended, from what the ledger recorded of it.
std::string attempt_outcome(const std::string& status, const std::optional<std::string>& error,
                            const std::optional<std::string>& charge,
                            const std::optional<std::string>& intent) {
    std::string out = status;
    if (error && status != "charged") out += ": " + *error;
    if (charge) out += " (charge " + *charge + ")";
    if (intent) out += " (payment intent " + *intent + ")";
    return out;
}

// Each attempt at the key's charge (migration 0022): the first delivery, then every retry of a decline,
// each with how it ended — the next retry's record of it, or the row for the last. Nothing when never
// retried, or on a schema without the table.
net::awaitable<result<void>> load_attempts(std::shared_ptr<pg::pool> pool, explanation& x,
                                           const std::string& key) {
    auto t = co_await run_query(*pool, "SELECT to_regclass('billing_retries') IS NOT NULL", pg::params());
    if (!t) co_return t.err();
    if (t->text(0, 0) != "t" || !x.row) co_return result<void>{};
    auto r = co_await billing::retry_store(pool).retries_of(key);
    if (!r) co_return r.err();
    if (r->empty()) co_return result<void>{};
    const auto& row = *x.row;
    for (std::size_t i = 0; i <= r->size(); ++i) {
        attempt_view a;
        if (i == 0) {
            a.generation = std::to_string((*r)[0].generation - 1);
            a.started = "first delivery";
        } else {
            const auto& k = (*r)[i - 1];
            a.generation = std::to_string(k.generation);
            a.started = "retry #" + std::to_string(k.id) + " by " + k.requested_by + " at " + k.requested_at +
                        ": " + k.reason;
        }
        if (i < r->size()) {
            const auto& next = (*r)[i];
            a.outcome = attempt_outcome(next.previous_status, next.previous_error, next.previous_charge_id,
                                        next.previous_payment_intent_id);
        } else {
            a.outcome = attempt_outcome(row.str("status"), row.get("last_error"), row.get("charge_id"),
                                        row.get("payment_intent_id"));
        }
        x.attempts.push_back(std::move(a));
    }
    co_return result<void>{};
}

// The recovery search (stripe::client), read-only.
net::awaitable<result<void>> load_stripe(stripe::client& client, explanation& x, const std::string& cus,
                                         const std::string& key, const std::string& account) {
    x.stripe.asked = true;
    auto ch = co_await client.find_charge_by_billing_key(cus, key, std::nullopt, 100, account);
    if (!ch) co_return ch.err();
    x.stripe.charge = std::move(*ch);
    auto pi = co_await client.find_payment_intent_by_billing_key(cus, key, std::nullopt, 100, account);
    if (!pi) co_return pi.err();
    x.stripe.intent = std::move(*pi);
    co_return result<void>{};
}

}  // namespace cg::app::explain_impl
