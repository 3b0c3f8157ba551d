#include <simdjson.h>

#include <map>
#include <set>

#include "billing/key.hpp"
#include "lab/run_state.hpp"

namespace cg::lab {

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
    std::set<std::string> keys = v.keys;
    if (v.safe)  // the pipeline's keys: the content key and its later generations
        for (int i = 1; i <= s.events; ++i) {
            auto base = billing::base_key(key_namespace, "cust-" + std::to_string(i), billing_period);
            for (int g = 1; g <= 5; ++g) keys.insert(billing::stripe_idempotency_key(base, g));
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
