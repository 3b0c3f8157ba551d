#include "billing/heal/backfill_rows.hpp"

#include <map>

#include "billing/machine/key.hpp"

namespace cg::billing::backfill_rows {

std::optional<charge_owner> owner_of(const stripe::charge& ch, const std::string& ns,
                                     const std::string& account) {
    if (ch.customer.empty()) return std::nullopt;
    auto key = stripe::metadata_value(ch.metadata, "billing_key");
    auto customer = stripe::metadata_value(ch.metadata, "customer_id");
    auto period = stripe::metadata_value(ch.metadata, "billing_period");
    if (!key || !customer || !period || customer->empty() || period->empty()) return std::nullopt;
    if (base_key(ns, *customer, *period, account) != *key) return std::nullopt;
    return charge_owner{std::string(*key), std::string(*customer), std::string(*period)};
}

void add_charged(const stripe::charge& ch, const charge_owner& o, missing_rows& out) {
    out.keys.emplace_back(o.key);
    out.customers.emplace_back(o.customer);
    out.periods.emplace_back(o.period);
    out.amounts.push_back(ch.amount);
    out.currencies.push_back(ch.currency);
    out.stripe_customers.push_back(ch.customer);
    out.charges.push_back(ch.id);
    out.intents.push_back(ch.payment_intent);
    out.descriptions.push_back(ch.description);
    out.created.push_back(ch.created);
}

std::vector<std::pair<in_flight_candidate, std::int64_t>> choose_in_flight(
    std::vector<in_flight_candidate> all, const std::set<std::string>& charged_keys) {
    std::map<std::string, std::vector<in_flight_candidate>> by_key;
    for (auto& c : all)
        if (!charged_keys.contains(c.key)) by_key[c.key].push_back(std::move(c));
    std::vector<std::pair<in_flight_candidate, std::int64_t>> out;
    for (auto& [key, cs] : by_key) {
        const in_flight_candidate* pick = nullptr;
        for (const auto& c : cs)  // newest first: the first pending, else the first failed
            if (!c.failed && (!pick || pick->failed)) pick = &c;
        if (!pick) pick = &cs.front();
        std::int64_t generation = 1;
        for (const auto& c : cs)
            if (c.failed && c.order > pick->order) ++generation;
        out.emplace_back(*pick, generation);
    }
    return out;
}

}  // namespace cg::billing::backfill_rows
