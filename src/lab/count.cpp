#include <simdjson.h>

#include <map>
#include <set>

#include "billing/machine/key.hpp"
#include "billing/store/correction_ledger.hpp"
#include "lab/run_state.hpp"
#include "stripe/refunds.hpp"

namespace cg::lab {

// A correction scenario's row counts refunds where the others count charges: one per customer is right, more
// are duplicates, none leaves the customer uncorrected ("uncharged"). Read through the Stripe API
// (GET /v1/refunds), by metadata[customer_id], which both consumers set.
namespace {

net::awaitable<void> count_refunds(run_t& v, row& out) {
    auto r = co_await v.stripe->call("GET", "/v1/refunds?limit=100", {}, {});
    if (r.cls != stripe::outcome_class::succeeded) throw std::runtime_error("GET /v1/refunds: " + r.message);
    auto page = stripe::parse_refund_page(r.http.resp.body);
    if (!page) throw std::runtime_error("GET /v1/refunds: " + page.err().describe());
    std::map<std::string, std::uint64_t> per_customer;
    for (const auto& f : page->data)
        if (!stripe::refund_undone(f.status))
            ++per_customer[std::string(stripe::metadata_value(f.metadata, "customer_id").value_or(""))];
    for (int i = 1; i <= v.sc->events; ++i) {
        auto n = per_customer["cust-" + std::to_string(i)];
        if (n == 0) ++out.customers_uncharged;
        if (n > 1) out.duplicate_charges += n - 1;
    }
}

}  // namespace

// The row: the consumers' and nsqd's counts, and what fake-stripe holds — succeeded charges per customer, and
// POSTs per idempotency key the run used.
net::awaitable<row> lab::count(variant_run& v) {
    const auto& s = *v.sc;
    row out;
    out.scenario = s.name;
    out.deliveries = v.received;
    out.fin_failed = v.fin_failed;
    out.disconnects = v.disconnects;
    out.nsqd_timeouts = v.timeouts;
    std::vector<std::string> customers;
    for (int i = 1; i <= s.events; ++i) customers.push_back(stripe_customer(i));
    auto charged_cents = co_await count_charges(out, std::move(customers));
    if (v.vault) out.vault = co_await vault_count(v, charged_cents);
    out.variant = variant_label(v.safe ? "safe" : "unsafe", out.vault);
    if (s.correction) co_await count_refunds(v, out);
    std::set<std::string> keys = v.keys;
    if (v.safe)  // the pipeline's keys: the content key and its later generations (and its correction's)
        for (int i = 1; i <= s.events; ++i) {
            auto base = billing::base_key(key_namespace, "cust-" + std::to_string(i), billing_period);
            for (int g = 1; g <= 5; ++g) {
                keys.insert(billing::stripe_idempotency_key(base, g));
                if (s.correction)
                    keys.insert(billing::stripe_idempotency_key(billing::correction_key(base, 1), g));
            }
        }
    co_await count_posts(out, std::move(keys));
    co_return out;
}

net::awaitable<std::int64_t> lab::count_charges(row& out, std::vector<std::string> customers) {
    auto charges = co_await admin("GET", "/_admin/charges", "");
    if (!charges) throw std::runtime_error(charges.err().describe());
    std::map<std::string, std::uint64_t> per_customer;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    simdjson::dom::array data;
    if (p.parse(*charges).get(doc) || doc["data"].get(data))
        throw std::runtime_error("fake-stripe /_admin/charges: unexpected JSON");
    std::int64_t charged_cents = 0;
    for (auto c : data) {
        std::string_view status, customer;
        std::int64_t amount = 0;
        if (c["status"].get(status) || status != "succeeded" || c["customer"].get(customer) ||
            c["amount"].get(amount))
            continue;
        ++per_customer[std::string(customer)];
        ++out.charges_created;
        charged_cents += amount;
    }
    for (const auto& customer : customers) {
        auto n = per_customer[customer];
        if (n == 0) ++out.customers_uncharged;
        if (n > 1) out.duplicate_charges += n - 1;
    }
    co_return charged_cents;
}

net::awaitable<void> lab::count_posts(row& out, std::set<std::string> keys) {
    for (const auto& k : keys) {
        auto r = co_await admin("GET", "/_admin/posts?key=" + http::url_encode(k), "");
        simdjson::dom::parser pp;
        simdjson::dom::element d;
        std::int64_t n = 0;
        if (!r || pp.parse(*r).get(d) || d["count"].get(n))
            throw std::runtime_error("fake-stripe /_admin/posts: " + (r ? *r : r.err().describe()));
        out.stripe_posts += static_cast<std::uint64_t>(n);
    }
}

}  // namespace cg::lab
