#include "billing/expected_run.hpp"

#include <sstream>

#include "billing/event.hpp"

namespace cg::billing {

std::size_t expected_total::skipped_total() const {
    std::size_t n = 0;
    for (const auto& [why, count] : skipped) n += count;
    return n;
}

expected_total sum_expected(std::istream& in, const std::string& period, const std::string& currency) {
    expected_total out;
    std::map<std::string, std::int64_t> seen;  // customer_id → amount counted
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        ++out.lines;
        auto ev = parse_event(line);
        if (!ev) {
            // "event lacks a required field: customer_id", as the dead-letter table words it.
            std::string why = ev.err().code.message();
            if (!ev.err().message.empty()) why += ": " + ev.err().message;
            ++out.skipped["invalid (" + why + ")"];
            continue;
        }
        if (ev->billing_period != period) {
            ++out.skipped["other period " + ev->billing_period];
            continue;
        }
        if (ev->currency != currency) {
            ++out.skipped["currency " + ev->currency + ", not " + currency];
            continue;
        }
        auto [it, fresh] = seen.emplace(ev->customer_id, ev->amount_cents);
        if (!fresh) {
            // The ledger charges a (customer, period) once: a repeat is a duplicate delivery, and one with
            // another amount is dead-lettered as a conflict. Neither adds to the period's spend.
            ++out.skipped[it->second == ev->amount_cents ? "duplicate of an earlier line"
                                                         : "conflicting duplicate (other amount)"];
            continue;
        }
        out.total_cents += ev->amount_cents;
        ++out.counted;
    }
    return out;
}

expected_total sum_expected(std::string_view jsonl, const std::string& period, const std::string& currency) {
    std::istringstream in{std::string(jsonl)};
    return sum_expected(in, period, currency);
}

}  // namespace cg::billing
