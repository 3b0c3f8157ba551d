#include "app/reconcile_steps.hpp"

#include <simdjson.h>

#include <optional>

#include "billing/flow/recovery.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "billing/store/retry_store.hpp"
#include "pg/rows.hpp"
#include "stripe/error.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app::reconcile_detail {
namespace {

using namespace std::chrono;

// The ledger's stored columns (billing::stored_record_columns()), then, read by name: whether the lease has
// run out, when the row was created and the payment method (set: the event charges through a PaymentIntent).
std::string row_select(std::string_view where) {
    return "SELECT " + billing::stored_record_columns() +
           ", (lease_until IS NULL OR lease_until < now()) AS lease_expired, "
           "extract(epoch FROM created_at)::bigint AS created_epoch, payment_method FROM billing_records "
           "WHERE " +
           std::string(where);
}
const std::string rows_sql = row_select("billing_period = $1::text");
const std::string one_row_sql = row_select("key = $1::text");
// The periods with corrections (docs/design.md §4a): the money moved, and whether a revision is under way.
const std::string corrections_sql =
    "SELECT c.base_key, cg_correction_net_cents(c.base_key), bool_or(c.status IN ('waiting', 'pending')) "
    "FROM billing_corrections c JOIN billing_records b ON b.key = c.base_key WHERE b.billing_period = "
    "$1::text "
    "GROUP BY c.base_key";
const std::string letters_sql =
    "SELECT id, reason, billing_key, raw_body FROM dead_letters WHERE replayed_at IS NULL ORDER BY id";

struct ledger_row {
    billing::ledger_record rec;
    bool lease_expired = true;
    std::int64_t created = 0;
    bool payment_intent = false;
};

ledger_row decode_row(const pg::rows& r, std::size_t i) {
    ledger_row out;
    out.rec = billing::decode_stored_record_columns(r, i);
    out.lease_expired = r.get<bool>(i, r.column("lease_expired"));
    out.created = r.get<std::int64_t>(i, r.column("created_epoch"));
    out.payment_intent = !r.is_null(i, r.column("payment_method"));
    return out;
}

billing::charge_fact fact_of(const stripe::charge& c) {
    return {c.id,       c.amount,
            c.currency, c.customer,
            c.status,   std::string(stripe::metadata_value(c.metadata, "billing_key").value_or(""))};
}

// Loose read of a dead letter's body: the customer, period and account, even when another field is invalid.
std::optional<ident> letter_ident(const std::string& body, simdjson::dom::parser& p) {
    simdjson::dom::element doc;
    if (p.parse(body).get(doc) != simdjson::SUCCESS) return std::nullopt;
    std::string_view c, per, acct;
    if (doc["customer_id"].get(c) != simdjson::SUCCESS || doc["billing_period"].get(per) != simdjson::SUCCESS)
        return std::nullopt;
    if (doc["stripe_account"].get(acct) != simdjson::SUCCESS) acct = {};
    return ident{std::string(c), std::string(per), std::string(acct)};
}

}  // namespace

net::awaitable<bool> load_ledger(reconcile_run& run, std::int64_t& earliest) {
    auto rows = co_await run.query(rows_sql, pg::params(run.f.period));
    if (!rows) {
        run.failure = "reading the ledger: " + rows.err().describe();
        co_return false;
    }
    for (std::size_t i = 0; i < rows->size(); ++i) {
        auto row = decode_row(*rows, i);
        earliest = earliest < 0 ? row.created : std::min(earliest, row.created);
        ident who{row.rec.customer_id, row.rec.billing_period, row.rec.stripe_account};
        if (!who.account.empty()) run.accounts.insert(who.account);
        auto& it = run.at(who, row.rec.key);
        it.facts.key = row.rec.key;  // the ledger's key wins (another namespace may have written it)
        run.by_key[row.rec.key] = it.who;
        it.lease_expired = row.lease_expired;
        it.payment_intent = row.payment_intent;
        it.facts.record = std::move(row.rec);
    }
    auto corrections = co_await run.query(corrections_sql, pg::params(run.f.period));
    if (!corrections) {
        run.failure = "reading the corrections: " + corrections.err().describe();
        co_return false;
    }
    for (std::size_t i = 0; i < corrections->size(); ++i) {
        auto who = run.by_key.find(corrections->get<std::string>(i, 0));
        if (who == run.by_key.end()) continue;
        auto& it = run.at(who->second, who->first);
        it.facts.corrected_net = corrections->get<std::int64_t>(i, 1);
        it.facts.correction_open = corrections->get<bool>(i, 2);
    }
    auto letters = co_await run.query(letters_sql, pg::params());
    if (!letters) {
        run.failure = "reading dead letters: " + letters.err().describe();
        co_return false;
    }
    simdjson::dom::parser p;
    for (std::size_t i = 0; i < letters->size(); ++i) {
        auto body = letters->get<bytes>(i, 3);
        auto who = letter_ident(std::string(body.begin(), body.end()), p);
        if (!who || who->period != run.f.period) continue;
        auto key = billing::base_key(run.f.key_namespace, who->customer, who->period, who->account);
        auto& it = run.at(*who, key);
        if (!it.facts.dead_letter_reason)
            it.facts.dead_letter_reason =
                "dead letter " + std::string(letters->text(i, 0)) + ": " + std::string(letters->text(i, 1));
    }
    co_return true;
}

namespace {

// One account's charges (account empty: the platform's). A charge is filed under the account it lives in: one
// carrying a key the run knows for another account is reported apart, under this account.
net::awaitable<bool> scan_account(reconcile_run& run, std::int64_t since, const std::string& account) {
    stripe::list_charges_request req;
    req.created_gte = since;
    req.limit = 100;
    req.stripe_account = account;
    for (;;) {
        co_await run.pace();
        auto page = co_await run.stripe.list_charges(req);
        if (!page) {
            // A failed call says how it ended; a body that is not a list says what is wrong with it.
            const auto& e = page.err();
            run.failure = "listing Stripe charges" + (account.empty() ? "" : " in " + account) + ": " +
                          (e.code == stripe::errc::bad_response ? e.describe() : e.message);
            co_return false;
        }
        for (const auto& c : page->data) {
            auto key = stripe::metadata_value(c.metadata, "billing_key");
            if (!key) continue;
            auto known = run.by_key.find(std::string(*key));
            if (known != run.by_key.end() && known->second.account == account) {
                run.items[known->second].facts.charges.push_back(fact_of(c));
                continue;
            }
            auto period = stripe::metadata_value(c.metadata, "billing_period");
            if (known == run.by_key.end() && period != run.f.period) continue;
            ident who{std::string(stripe::metadata_value(c.metadata, "customer_id").value_or("?")),
                      std::string(period.value_or(run.f.period)), account};
            if (known != run.by_key.end()) {
                // Our key, in an account its entry is not charged in: money the ledger does not account for
                // there, whatever the entry's own state.
                auto& it = run.items[who];
                it.who = who;
                if (it.facts.key.empty()) it.facts.key = std::string(*key);
                it.facts.charges.push_back(fact_of(c));
                continue;
            }
            run.at(who, std::string(*key)).facts.charges.push_back(fact_of(c));
        }
        if (!page->has_more || page->data.empty()) co_return true;
        req.starting_after = page->data.back().id;
    }
}

}  // namespace

// The platform first, then each connected account (Stripe Connect: an account's charges are listed only with
// its Stripe-Account).
net::awaitable<bool> scan_stripe(reconcile_run& run, std::int64_t since) {
    if (!co_await scan_account(run, since, "")) co_return false;
    for (const auto& account : run.accounts)
        if (!co_await scan_account(run, since, account)) co_return false;
    co_return true;
}

// The pipeline's recovery search (billing/flow/recovery.hpp) for a pending row, read by the machine
// (on_found, then on_reconcile_found): what it finds settled or declined settles the row (mark_* apply only
// to a still-pending row, so a worker settling it meanwhile wins); a payment still moving is left to the
// pipeline, which follows it.
net::awaitable<void> resolve_pending(reconcile_run& run, billing::ledger& ledger, item& it) {
    auto& rec = *it.facts.record;
    billing::recovery_query q{rec.stripe_customer_id,        rec.key,           rec.first_stripe_attempt_at,
                              billing::default_search_slack, it.payment_intent, rec.stripe_account};
    if (rec.key_generation >= 2) {
        // A retried declined row: its earlier attempts' payments are not the current generation's answer.
        auto old = co_await billing::retry_store(ledger.pool()).superseded_payments(rec.key);
        if (!old) {
            it.action = "reading the row's retries failed: " + old.err().describe();
            co_return;
        }
        q.superseded = std::move(*old);
    }
    auto found =
        co_await billing::search_by_key(run.stripe, std::move(q), run.log, [&run] { return run.pace(); });
    if (!found) {
        it.action = "recovery search failed: " + found.err().describe();
        co_return;
    }
    if (!found->charge && !found->intent) {
        it.action =
            it.lease_expired ? "no charge carries the key" : "no charge yet; a worker holds the lease";
        co_return;
    }
    const std::string id = found->charge_id.value_or(found->payment_intent_id.value_or(""));
    const auto command = billing::machine::on_reconcile_found(found->command);
    if (command == billing::machine::reconcile_command::leave) {
        it.action = "found " + id + " still " + found->status + "; left to the pipeline";
        co_return;
    }
    const bool declined = command == billing::machine::reconcile_command::mark_declined;
    result<bool> marked = false;
    if (declined)
        marked = co_await ledger.mark_declined(rec.key, found->charge_id,
                                               "declined (found by reconcile): " + found->decline,
                                               found->payment_intent_id);
    else
        marked = co_await ledger.mark_charged(rec.key, id, found->payment_intent_id);
    if (!marked) {
        it.action = "found " + id + " but recording it failed: " + marked.err().describe();
        co_return;
    }
    it.action = std::string(*marked ? "settled " : "already settled; found ") +
                (declined ? "declined " : "charged ") + id;
    auto again = co_await run.query(one_row_sql, pg::params(rec.key));
    if (again && !again->empty()) {
        auto row = decode_row(*again, 0);
        it.lease_expired = row.lease_expired;
        it.facts.record = std::move(row.rec);
    }
    if (!found->charge) co_return;
    bool listed = false;
    for (const auto& c : it.facts.charges) listed = listed || c.id == found->charge->id;
    if (!listed) it.facts.charges.push_back(fact_of(*found->charge));
}

// The charge a charged row names: from the scan, else retrieved (Stripe's 404: it does not exist; a body that
// is not a charge leaves it unknown).
net::awaitable<void> check_recorded(reconcile_run& run, item& it) {
    const auto& id = *it.facts.record->charge_id;
    for (const auto& c : it.facts.charges)
        if (c.id == id) {
            it.facts.recorded_charge_known = true;
            it.facts.recorded_charge = c;
            co_return;
        }
    co_await run.pace();
    auto got = co_await run.stripe.retrieve_charge_if_any(id, it.facts.record->stripe_account);
    if (got) {
        it.facts.recorded_charge_known = true;
        if (*got) it.facts.recorded_charge = fact_of(**got);
    } else if (got.err().code != stripe::errc::bad_response) {
        it.action = "could not retrieve " + id + ": " + got.err().message;
    }
}

}  // namespace cg::app::reconcile_detail
