#include "billing/report/expected_run.hpp"

#include <algorithm>
#include <sstream>

#include "billing/machine/event.hpp"

namespace cg::billing {

std::size_t expected_total::skipped_total() const {
    std::size_t n = 0;
    for (const auto& [why, count] : skipped) n += count;
    return n;
}

void for_each_event_line(std::string_view text, const event_line_fn& f) {
    std::size_t line_no = 0, pos = 0;
    while (pos <= text.size()) {
        auto nl = text.find('\n', pos);
        auto line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        auto ev = parse_event(line);
        if (!f(line_no, line, ev)) return;
    }
}

expected_total sum_expected(std::string_view jsonl, const std::string& period, const std::string& currency,
                            const std::optional<std::string>& account) {
    expected_total out;
    // (customer_id, stripe_account) → amount counted: one charge each, as the ledger has one row each.
    using entry = std::pair<std::string, std::string>;
    std::map<entry, std::int64_t> seen;
    // (customer_id, stripe_account) → revision → new total: the period's corrections (docs/design.md §4a).
    std::map<entry, std::map<std::int32_t, std::int64_t>> corrections;
    for_each_event_line(jsonl, [&](std::size_t, std::string_view, result<billing_event>& ev) {
        ++out.lines;
        if (!ev) {
            // "event lacks a required field: customer_id", as the dead-letter table words it.
            std::string why = ev.err().code.message();
            if (!ev.err().message.empty()) why += ": " + ev.err().message;
            ++out.skipped["invalid (" + why + ")"];
            return true;
        }
        if (ev->billing_period != period) {
            ++out.skipped["other period " + ev->billing_period];
            return true;
        }
        if (ev->currency != currency) {
            ++out.skipped["currency " + ev->currency + ", not " + currency];
            return true;
        }
        if (account && ev->stripe_account != *account) {
            ++out.skipped["other Stripe account " + (ev->stripe_account.empty()
                                                         ? std::string("(the platform's own)")
                                                         : ev->stripe_account)];
            return true;
        }
        if (ev->is_correction()) {
            auto [r, fresh] =
                corrections[{ev->customer_id, ev->stripe_account}].emplace(ev->revision, ev->amount_cents);
            if (!fresh)
                ++out.skipped[r->second == ev->amount_cents ? "duplicate of an earlier line"
                                                            : "conflicting duplicate (other amount)"];
            return true;
        }
        auto [it, fresh] = seen.emplace(entry{ev->customer_id, ev->stripe_account}, ev->amount_cents);
        if (!fresh) {
            // The ledger charges a (customer, period) once: a repeat is a duplicate delivery, and one with
            // another amount is dead-lettered as a conflict. Neither adds to the period's spend.
            ++out.skipped[it->second == ev->amount_cents ? "duplicate of an earlier line"
                                                         : "conflicting duplicate (other amount)"];
            return true;
        }
        out.total_cents += ev->amount_cents;
        ++out.counted;
        return true;
    });
    // A correction charges what its total adds to the one before it; a refund returns no cap room by default
    // (vault.md), so what the period spends against the cap is the original plus every rise, in order.
    for (const auto& [who, by_rev] : corrections) {
        auto original = seen.find(who);
        if (original == seen.end()) {
            out.skipped["correction of a customer the run does not charge"] += by_rev.size();
            continue;
        }
        std::int64_t prev = original->second;
        for (const auto& [rev, total] : by_rev) {
            out.total_cents += std::max<std::int64_t>(0, total - prev);
            prev = total;
            ++out.counted;
        }
    }
    return out;
}

expected_total sum_expected(std::istream& in, const std::string& period, const std::string& currency,
                            const std::optional<std::string>& account) {
    std::ostringstream all;
    all << in.rdbuf();
    return sum_expected(all.str(), period, currency, account);
}

}  // namespace cg::billing
