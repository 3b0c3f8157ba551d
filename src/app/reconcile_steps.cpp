#include "app/reconcile_steps.hpp"

#include <simdjson.h>

#include <optional>

#include "billing/key.hpp"
#include "http/proto/message.hpp"
#include "pg/rows.hpp"
#include "stripe/json.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app::reconcile_detail {
namespace {

using namespace std::chrono;

// The ledger's stored columns (billing::stored_record_columns()), then whether the lease has run out and
// when the row was created.
std::string row_select(std::string_view where) {
    return "SELECT " + billing::stored_record_columns() +
           ", (lease_until IS NULL OR lease_until < now()) AS lease_expired, "
           "extract(epoch FROM created_at)::bigint FROM billing_records WHERE " +
           std::string(where);
}
const std::string rows_sql = row_select("billing_period = $1::text");
const std::string one_row_sql = row_select("key = $1::text");
const std::string letters_sql =
    "SELECT id, reason, billing_key, raw_body FROM dead_letters WHERE replayed_at IS NULL ORDER BY id";

struct ledger_row {
    billing::ledger_record rec;
    bool lease_expired = true;
    std::int64_t created = 0;
};

ledger_row decode_row(const pg::rows& r, std::size_t i) {
    ledger_row out;
    out.rec = billing::decode_stored_record_columns(r, i);
    out.lease_expired = r.get<bool>(i, 13);
    out.created = r.get<std::int64_t>(i, 14);
    return out;
}

billing::charge_fact fact_of(const stripe::charge& c) {
    return {c.id,       c.amount,
            c.currency, c.customer,
            c.status,   std::string(stripe::metadata_value(c.metadata, "billing_key").value_or(""))};
}

// Loose read of a dead letter's body: the customer and period, even when another field is invalid.
std::optional<ident> letter_ident(const std::string& body, simdjson::dom::parser& p) {
    simdjson::dom::element doc;
    if (p.parse(body).get(doc) != simdjson::SUCCESS) return std::nullopt;
    std::string_view c, per;
    if (doc["customer_id"].get(c) != simdjson::SUCCESS || doc["billing_period"].get(per) != simdjson::SUCCESS)
        return std::nullopt;
    return ident(std::string(c), std::string(per));
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
        auto& it = run.at({row.rec.customer_id, row.rec.billing_period}, row.rec.key);
        it.facts.key = row.rec.key;  // the ledger's key wins (another namespace may have written it)
        run.by_key[row.rec.key] = it.who;
        it.lease_expired = row.lease_expired;
        it.facts.record = std::move(row.rec);
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
        if (!who || who->second != run.f.period) continue;
        auto key = billing::base_key(run.f.key_namespace, who->first, who->second);
        auto& it = run.at(*who, key);
        if (!it.facts.dead_letter_reason)
            it.facts.dead_letter_reason =
                "dead letter " + std::string(letters->text(i, 0)) + ": " + std::string(letters->text(i, 1));
    }
    co_return true;
}

// Every charge created since `since`, newest first, 100 per page; keeps those of this period (or carrying a
// key we know).
net::awaitable<bool> scan_stripe(reconcile_run& run, std::int64_t since) {
    std::string after;
    for (;;) {
        std::string target = "/v1/charges?limit=100&created[gte]=" + std::to_string(since);
        if (!after.empty()) target += "&starting_after=" + http::url_encode(after);
        co_await run.pace();
        auto r = co_await run.stripe.call("GET", target, "", "");
        if (r.cls != stripe::outcome_class::succeeded) {
            run.failure = "listing Stripe charges: " + r.message;
            co_return false;
        }
        auto page = stripe::parse_charge_page(r.http.resp.body);
        if (!page) {
            run.failure = "listing Stripe charges: " + page.err().describe();
            co_return false;
        }
        for (const auto& c : page->data) {
            auto key = stripe::metadata_value(c.metadata, "billing_key");
            if (!key) continue;
            auto known = run.by_key.find(std::string(*key));
            if (known != run.by_key.end()) {
                run.items[known->second].facts.charges.push_back(fact_of(c));
                continue;
            }
            auto period = stripe::metadata_value(c.metadata, "billing_period");
            if (period != run.f.period) continue;
            ident who(std::string(stripe::metadata_value(c.metadata, "customer_id").value_or("?")),
                      run.f.period);
            run.at(who, std::string(*key)).facts.charges.push_back(fact_of(c));
        }
        if (!page->has_more || page->data.empty()) co_return true;
        after = page->data.back().id;
    }
}

// The pipeline's recovery for a pending row: search the customer's charges for the base key; a charge found
// settles the row (mark_* apply only to a still-pending row, so a worker settling it meanwhile wins).
net::awaitable<void> resolve_pending(reconcile_run& run, billing::ledger& ledger, item& it) {
    auto& rec = *it.facts.record;
    std::optional<std::int64_t> since;
    if (rec.first_stripe_attempt_at)
        since = duration_cast<seconds>((*rec.first_stripe_attempt_at - hours(24)).time_since_epoch()).count();
    co_await run.pace();
    auto found = co_await run.stripe.find_charge_by_billing_key(rec.stripe_customer_id, rec.key, since);
    if (!found) {
        it.action = "recovery search failed: " + found.err().describe();
        co_return;
    }
    if (!*found) {
        it.action =
            it.lease_expired ? "no charge carries the key" : "no charge yet; a worker holds the lease";
        co_return;
    }
    const auto& ch = **found;
    result<bool> marked = false;
    if (ch.status == "failed")
        marked = co_await ledger.mark_declined(rec.key, ch.id,
                                               "declined (found by reconcile): " + ch.failure_code);
    else
        marked = co_await ledger.mark_charged(rec.key, ch.id);
    if (!marked) {
        it.action = "found " + ch.id + " but recording it failed: " + marked.err().describe();
        co_return;
    }
    it.action = std::string(*marked ? "settled " : "already settled; found ") +
                (ch.status == "failed" ? "declined " : "charged ") + ch.id;
    auto again = co_await run.query(one_row_sql, pg::params(rec.key));
    if (again && !again->empty()) {
        auto row = decode_row(*again, 0);
        it.lease_expired = row.lease_expired;
        it.facts.record = std::move(row.rec);
    }
    bool listed = false;
    for (const auto& c : it.facts.charges) listed = listed || c.id == ch.id;
    if (!listed) it.facts.charges.push_back(fact_of(ch));
}

// The charge a charged row names: from the scan, else retrieved (404: it does not exist).
net::awaitable<void> check_recorded(reconcile_run& run, item& it) {
    const auto& id = *it.facts.record->charge_id;
    for (const auto& c : it.facts.charges)
        if (c.id == id) {
            it.facts.recorded_charge_known = true;
            it.facts.recorded_charge = c;
            co_return;
        }
    co_await run.pace();
    auto r = co_await run.stripe.call("GET", "/v1/charges/" + http::url_encode(id), "", "");
    if (r.cls == stripe::outcome_class::succeeded) {
        if (auto c = stripe::parse_charge(r.http.resp.body)) {
            it.facts.recorded_charge_known = true;
            it.facts.recorded_charge = fact_of(*c);
        }
    } else if (r.http.ok() && r.http.resp.status == 404) {
        it.facts.recorded_charge_known = true;
    } else {
        it.action = "could not retrieve " + id + ": " + r.message;
    }
}

}  // namespace cg::app::reconcile_detail
