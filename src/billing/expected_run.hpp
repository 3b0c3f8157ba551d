// The expected total of one billing period, from the JSONL billing run that `publish` takes: what
// `vault issue --expected-file` caps a key at, and what the lab's spend-cap runs cap theirs at. Every line is
// validated with billing::parse_event, exactly as `consume` would; each (customer, period) counts once, as
// the ledger charges it once. Pure (reads an istream or a string).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <string_view>

namespace cg::billing {

struct expected_total {
    std::int64_t total_cents = 0;
    std::size_t lines = 0;    // non-empty lines read
    std::size_t counted = 0;  // events summed
    // Why other lines were not summed, with how many: "invalid: amount_cents: must be …", "other period
    // 2026-10", "currency eur, not usd", "duplicate of an earlier line", "conflicting duplicate (other
    // amount)".
    std::map<std::string, std::size_t> skipped;
    std::size_t skipped_total() const;
};

expected_total sum_expected(std::istream& in, const std::string& period, const std::string& currency);
expected_total sum_expected(std::string_view jsonl, const std::string& period, const std::string& currency);

}  // namespace cg::billing
