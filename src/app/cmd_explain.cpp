// `chargeguard explain`: was this customer charged for this period, and if not, why?
//
//   chargeguard explain --customer C --period P [--key-namespace N] [--stripe] [--json]
//   chargeguard explain --key K
//   echo '<billing event JSON>' | chargeguard explain
//
// Computes the idempotency key as consume does (billing/machine/key.hpp), then shows the ledger row (looked
// up by key, and by customer and period, which are unique: a row written under another key namespace is found
// too), the key's dead letters, its vault spend reservations when the vault tables exist, and with --stripe
// the live Stripe objects carrying metadata[billing_key] — the same list-and-metadata search recovery uses
// (stripe::client::find_charge_by_billing_key / find_payment_intent_by_billing_key). Read-only: it changes
// nothing anywhere. Corrections (docs/design.md §4a): every revision of the period with its total and state,
// and each of its money moves with its Stripe object (charge, refund, PaymentIntent); a correction's key
// (base-rN…) given to --key shows its period. Ends with a one-line verdict; exit 0 when the event is charged
// once, 2 otherwise, 1 when PostgreSQL or Stripe could not be asked.
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <tuple>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/explain_render.hpp"
#include "app/pg_flags.hpp"
#include "app/stripe_flags.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/settlement.hpp"
#include "billing/store/retry_store.hpp"
#include "net/offload.hpp"
#include "pg/rows.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"
#include "stripe/types.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
// A named namespace, not an anonymous one: the unity build joins the app's files into one unit.
namespace explain_impl {

struct explain_flags {
    pg_flags pg;
    stripe_flags stripe;
    std::string customer, period, key;
    std::string stripe_account;  // a Connect event's account (part of its key; searched in it)
    std::string key_namespace = "chargeguard";
    bool with_stripe = false;
    bool json = false;
    std::string stripe_customer;     // from a stdin event
    std::string by_stripe_customer;  // --stripe-customer cus_…: every key and charge of it in --period
};

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

// "; corrected to 700 cents by revision 2 (applied); net moved 700 cents", and any revision still open.
std::string corrections_summary(const explanation& x) {
    if (!x.corrections || x.corrections->empty()) return "";
    const auto& last = x.corrections->back();
    std::string out = "; corrected to " + last.total_cents + " cents by revision " + last.revision + " (" +
                      last.status + ")";
    for (const auto& rev : *x.corrections)
        if (rev.status == "pending" || rev.status == "waiting")
            out += "; revision " + rev.revision + " " + rev.status;
    if (x.net_cents) out += "; net moved " + *x.net_cents + " cents";
    return out;
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

std::string replay_hint(const explanation& x) {
    for (const auto& l : x.letters)
        if (l.open()) return "; replay with chargeguard dead-letters replay " + l.id;
    return "";
}

const letter_view* open_letter(const explanation& x) {
    for (const auto& l : x.letters)
        if (l.open()) return &l;
    return nullptr;
}

// The verdict from what was found. Ledger first (it is the record of truth consume writes), then Stripe.
void decide(explanation& x) {
    const letter_view* letter = open_letter(x);
    if (!x.row) {
        if (letter) {
            x.state = "dead_lettered";
            x.verdict = "dead-lettered: " + letter->reason + replay_hint(x);
        } else if (!x.letters.empty()) {
            // Every letter closed, and still no row: a dismissal, or a replay whose event has not arrived.
            const auto& l = x.letters.back();
            x.state = "dead_lettered";
            x.verdict = "dead-lettered: " + l.reason + " (letter " + l.id + " " +
                        (l.dismissed_at ? "dismissed at " + *l.dismissed_at
                                        : "replayed at " + l.replayed_at.value_or("?")) +
                        "; no ledger row since)";
        } else {
            x.state = "never_seen";
            x.verdict = "never seen: no ledger row and no dead letter for key " + x.key +
                        " (was the event published? is --key-namespace " + x.key_namespace + " consume's?)";
        }
        if (x.stripe.charge)
            x.verdict += "; but Stripe holds " + x.stripe.charge->id + " (" + x.stripe.charge->status +
                         ") for this key";
        return;
    }
    const auto& r = *x.row;
    auto status = r.str("status");
    auto err = r.get("last_error").value_or("no error recorded");
    x.state = status;
    if (status == "charged") {
        x.verdict = "charged once: " + r.str("charge_id") + " at " + r.str("updated_at");
        auto refunded = r.str("refunded_cents");
        if (!refunded.empty() && refunded != "0")
            x.verdict += refunded == r.str("amount_cents")
                             ? "; refunded in full"
                             : "; refunded " + refunded + " of " + r.str("amount_cents") + " cents";
        if (auto d = r.get("dispute_status")) {
            std::int64_t cents = 0;
            const auto text = r.str("disputed_cents");
            std::from_chars(text.data(), text.data() + text.size(), cents);
            x.verdict += "; " + billing::describe_dispute(*d, cents);
        }
    } else if (status == "processing") {
        x.verdict = "processing since " + r.str("processing_since") + " (Stripe said " +
                    r.str("stripe_status") + " at " + r.str("stripe_status_at") +
                    "): the bank has not answered; a webhook or the processing poll settles it";
    } else if (status == "failed_after_processing") {
        x.verdict = "failed after processing: " + err + replay_hint(x);
    } else if (status == "pending") {
        if (r.lease_live)
            x.verdict = "pending: lease held (epoch " + r.str("lease_epoch") + ") until " +
                        r.str("lease_until") + ", will be retried";
        else if (r.get("indeterminate_since"))
            x.verdict =
                "pending, indeterminate since " + r.str("indeterminate_since") +
                " (Stripe's answer was lost): the next delivery searches Stripe before charging again";
        else
            x.verdict =
                "pending: lease expired; the next delivery resumes it (none coming: chargeguard "
                "reconcile --publish re-publishes it)";
        if (x.stripe.charge)
            x.verdict += "; Stripe already holds " + x.stripe.charge->id + " (" + x.stripe.charge->status +
                         ") for this key: recovery records it";
    } else if (status == "declined") {
        x.verdict = "declined: " + err +
                    "; once the payment method is fixed: chargeguard retry-declined --key " + r.str("key") +
                    " --reason R";
    } else if (status == "cap_blocked") {
        x.verdict = "cap-blocked: " + err + replay_hint(x);
    } else if (letter) {
        x.state = "dead_lettered";
        x.verdict = "dead-lettered: " + letter->reason + " (ledger row " + status + ")" + replay_hint(x);
    } else {
        x.verdict = status + ": " + err;
    }
    if (!x.attempts.empty())
        x.verdict += "; " + std::to_string(x.attempts.size()) + " attempts (" +
                     std::to_string(x.attempts.size() - 1) + " retried after a decline)";
    x.verdict += corrections_summary(x);
    if (r.str("key") != x.key)
        x.verdict += " (the row's key " + r.str("key") + " is not the computed one: another --key-namespace)";
}

// --stripe-customer: how many times the Stripe customer paid for the period, whatever customer ids the
// events came under. Stripe's succeeded charges when Stripe was asked (the money), else the ledger's charged
// rows.
void decide_stripe_customer(explanation& x) {
    const auto& c = *x.by_stripe_customer;
    std::vector<std::pair<std::string, std::string>> paid;  // (charge, customer id)
    if (c.stripe_asked) {
        for (const auto& ch : c.charges)
            if (stripe::charge_movement(ch.status) == stripe::movement::charged)
                paid.emplace_back(ch.id, ch.customer_id);
    } else {
        for (const auto& r : c.rows)
            if (r.status == "charged") paid.emplace_back(r.charge_id.value_or("-"), r.customer_id);
    }
    std::string where = c.stripe_asked ? "Stripe holds " : "the ledger records ";
    if (paid.empty()) {
        x.state = c.rows.empty() ? "never_seen" : "not_charged";
        x.verdict = "not charged: " + where + "no payment of " + c.stripe_customer + " for period " +
                    x.period + " (" + std::to_string(c.rows.size()) + " ledger row(s))";
        return;
    }
    std::sort(paid.begin(), paid.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second, a.first) < std::tie(b.second, b.first);  // by customer id, then charge
    });
    std::string list;
    std::vector<std::string> ids;
    for (const auto& [charge, customer] : paid) {
        list += (list.empty() ? "" : ", ") + customer + ": " + charge;
        if (std::find(ids.begin(), ids.end(), customer) == ids.end()) ids.push_back(customer);
    }
    if (paid.size() == 1) {
        x.state = "charged";
        x.verdict = "charged once: " + where + paid[0].first + " (customer id " + paid[0].second + ")";
        return;
    }
    x.state = "charged_more_than_once";
    x.verdict = (paid.size() == 2 ? std::string("charged twice")
                                  : "charged " + std::to_string(paid.size()) + " times") +
                ": " + where + std::to_string(paid.size()) + " payments of " + c.stripe_customer +
                " for period " + x.period + " under " + std::to_string(ids.size()) + " customer id(s) (" +
                list + ")";
}

net::awaitable<int> run_explain(const explain_flags* fp, std::shared_ptr<pg::pool> pool,
                                stripe::client* client, explanation x) {
    const auto& f = *fp;
    auto fail = [](const char* what, const error& e) {
        std::fprintf(stderr, "chargeguard explain: %s: %s\n", what, e.describe().c_str());
        return exit_failure;
    };
    if (!f.by_stripe_customer.empty()) {
        if (auto r =
                co_await load_by_stripe_customer(*pool, client, x, f.by_stripe_customer, f.stripe_account);
            !r)
            co_return fail("reading the Stripe customer's rows and charges", r.err());
        decide_stripe_customer(x);
        if (f.json)
            print_json(x);
        else
            print_text(x);
        co_return x.state == "charged" ? exit_ok : exit_problem;
    }
    if (auto r = co_await load_ledger(*pool, x, f.stripe_account); !r)
        co_return fail("reading the ledger", r.err());
    // A row found by customer and period under another key: its dead letters and spend carry that key.
    std::string key = x.row ? x.row->str("key") : x.key;
    // The row's own customer and period when found by key.
    std::string customer = x.row ? x.row->str("customer_id") : x.customer;
    std::string period = x.row ? x.row->str("billing_period") : x.period;
    std::string letter_account = x.row ? x.row->str("stripe_account") : f.stripe_account;
    if (auto r = co_await load_letters(*pool, x, key, customer, period, letter_account); !r)
        co_return fail("reading dead letters", r.err());
    if (auto r = co_await load_spend(*pool, x, key); !r)
        co_return fail("reading vault reservations", r.err());
    if (auto r = co_await load_corrections(*pool, x, key); !r) co_return fail("reading corrections", r.err());
    if (auto r = co_await load_attempts(pool, x, key); !r) co_return fail("reading retries", r.err());
    if (!client) {
        x.stripe.skipped = "not asked (--stripe searches it)";
    } else {
        std::string cus = x.row ? x.row->str("stripe_customer_id") : f.stripe_customer;
        // Named first: g++ 12 mishandles a conditional's temporary in a co_await's arguments.
        std::string account = x.row ? x.row->str("stripe_account") : f.stripe_account;
        if (cus.empty())
            x.stripe.skipped = "not searched: no ledger row and no event gives the Stripe customer";
        else if (auto r = co_await load_stripe(*client, x, cus, key, account); !r)
            co_return fail("searching Stripe", r.err());
    }
    decide(x);
    if (f.json)
        print_json(x);
    else
        print_text(x);
    co_return x.state == "charged" ? exit_ok : exit_problem;
}

// Fills customer/period/key from the flags or an event line on stdin; throws usage_error.
void resolve_subject(explain_flags& f) {
    if (!f.by_stripe_customer.empty()) {
        if (!f.customer.empty() || !f.key.empty())
            throw usage_error("--stripe-customer goes with --period only (it finds every customer id)");
        if (f.period.empty()) throw usage_error("--stripe-customer needs --period");
        if (f.by_stripe_customer.rfind("cus_", 0) != 0)
            bad_value("--stripe-customer", f.by_stripe_customer, "not a Stripe customer id (cus_…)");
        return;
    }
    bool by_customer = !f.customer.empty() || !f.period.empty();
    if (by_customer && !f.key.empty()) throw usage_error("give --key or --customer with --period, not both");
    if (!f.key.empty()) {
        // A key as logs and Stripe's metadata show it may carry a correction's or a generation's suffix
        // (base-r2, base-r2-p2, base-g2): the period is the base key's.
        auto base = f.key.substr(0, 32);
        auto suffix = f.key.size() > 32 ? f.key.substr(32) : std::string();
        bool hex = base.size() == 32 && base.find_first_not_of("0123456789abcdef") == std::string::npos;
        bool suffix_ok = suffix.empty() || (suffix.size() >= 3 && suffix[0] == '-' &&
                                            suffix.find_first_not_of("-rpg0123456789") == std::string::npos);
        if (!hex || !suffix_ok)
            bad_value("--key", f.key,
                      "not a billing key (32 lower-case hex digits, maybe -r<N>, -p<N>, -g<N>)");
        f.key = base;
        return;
    }
    if (by_customer) {
        if (f.customer.empty() || f.period.empty()) throw usage_error("--customer and --period go together");
        return;
    }
    if (::isatty(STDIN_FILENO))
        throw usage_error("give --customer C --period P, --key K, or a billing event line on stdin");
    std::string line;
    while (line.find_first_not_of(" \t\r") == std::string::npos && std::getline(std::cin, line)) {
    }
    auto ev = billing::parse_event(line);
    if (!ev) throw usage_error("stdin: not a billing event: " + ev.err().message);
    f.customer = ev->customer_id;
    f.period = ev->billing_period;
    f.stripe_customer = ev->stripe_customer_id;
    f.stripe_account = ev->stripe_account;
}

int explain_main(explain_flags f, const global_flags& g) {
    if (!billing::valid_key_namespace(f.key_namespace))
        bad_value("--key-namespace", f.key_namespace, "not 1-64 characters of [A-Za-z0-9_.-]");
    resolve_subject(f);
    explanation x;
    x.key_namespace = f.key_namespace;
    x.customer = f.customer;
    x.period = f.period;
    if (!f.stripe_account.empty() && !billing::valid_stripe_account(f.stripe_account))
        bad_value("--stripe-account", f.stripe_account, "not acct_ followed by letters and digits");
    if (f.by_stripe_customer.empty())
        x.key = f.key.empty() ? billing::base_key(f.key_namespace, f.customer, f.period, f.stripe_account)
                              : f.key;
    std::optional<stripe::client_config> scfg;
    if (f.with_stripe) scfg = to_stripe_config(f.stripe);
    auto opts = to_pool_options(f.pg);
    opts.size = 1;
    auto log = make_stderr_logger(g.level());
    asio::io_context io{1};
    net::offload_pool off{1};
    std::unique_ptr<stripe::client> client;
    if (scfg) {
        auto c = stripe::client::create(off.get_executor(), std::move(*scfg), log);
        if (!c) {
            std::fprintf(stderr, "chargeguard explain: %s\n", c.err().describe().c_str());
            return exit_failure;
        }
        client = std::move(*c);
    }
    auto pool = pg::pool::create(io.get_executor(), off.get_executor(), std::move(opts), log);
    int rc = run_then_close_pool(io, pool, run_explain(&f, pool, client.get(), std::move(x)), "explain");
    client.reset();
    off.drain();
    return rc;
}

}  // namespace explain_impl

void register_explain(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("explain",
                                   "was this customer charged for this period, and if not, why? (read-only)");
    cmd->footer(std::string("Examples:\n"
                            "  chargeguard explain --customer acme-42 --period 2026-11\n"
                            "  chargeguard explain --key 0f3c9a7e5b1d2c4f6a8b0c1d2e3f4a5b --stripe --json\n"
                            "  chargeguard explain --stripe-customer cus_N3x --period 2026-11 --stripe\n"
                            "  echo '{\"customer_id\":\"acme-42\",\"billing_period\":\"2026-11\",…}' | "
                            "chargeguard explain\n") +
                exit_code_table);
    using namespace explain_impl;
    auto f = std::make_shared<explain_flags>();
    cmd->add_option("--customer", f->customer, "the billing system's customer id (with --period)");
    cmd->add_option("--period", f->period, "the billing period, as in the events (e.g. 2026-11)");
    cmd->add_option(
        "--key", f->key,
        "a billing key (the ledger's key, logs' billing_key; a correction's base-rN shows its period)");
    cmd->add_option(
        "--stripe-account", f->stripe_account,
        "the connected account (acct_…) of a Stripe Connect event (with --customer and --period)");
    env(cmd->add_option("--key-namespace", f->key_namespace, "the key namespace consume uses")
            ->capture_default_str()
            ->group(group_pipeline),
        env_scope::connection);
    cmd->add_option(
        "--stripe-customer", f->by_stripe_customer,
        "a Stripe customer (cus_…): every ledger key and, with --stripe, every Stripe charge of it "
        "in --period, whatever customer ids its events came under");
    cmd->add_flag("--stripe", f->with_stripe,
                  "also search Stripe for charges and PaymentIntents carrying the key (as recovery does)")
        ->group(group_stripe);
    cmd->add_flag("--json", f->json, "one JSON object instead of the text");
    add_pg_flags(*cmd, f->pg, false);
    add_stripe_flags(*cmd, f->stripe);
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return explain_main(*f, g); }; });
}

}  // namespace cg::app
