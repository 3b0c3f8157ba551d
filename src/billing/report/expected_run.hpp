// The expected total of one billing period, from the JSONL billing run that `publish` takes: what
// `vault issue --expected-file` caps a key at, and what the lab's spend-cap runs cap theirs at. Every line is
// validated with billing::parse_event, exactly as `consume` would; each (customer, period, stripe_account)
// counts once, as the ledger charges it once, plus what each of its corrections (lines with a revision, in
// revision order) raises the total by — the charges they make; their refunds give the cap no room back by
// default. Pure (reads an istream or a string).
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "billing/machine/event.hpp"
#include "core/result.hpp"

namespace cg::billing {

// Each non-blank line of a JSONL billing run (LF or CR LF; a line of spaces, tabs and CRs is blank),
// numbered from 1, with its event as parse_event reads it: the one reader of the run, for `reconcile`
// (billing/report/reconcile.hpp parse_expected) and for the expected sum below. `f` returns false to stop.
using event_line_fn =
    std::function<bool(std::size_t line_no, std::string_view line, result<billing_event>& ev)>;
void for_each_event_line(std::string_view jsonl, const event_line_fn& f);

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

// `account`, when given, sums only the events of that Stripe account ("" the platform's own, as a vault key
// acts in exactly one); the others are skipped as "other Stripe account". Without it every account counts.
expected_total sum_expected(std::istream& in, const std::string& period, const std::string& currency,
                            const std::optional<std::string>& account = std::nullopt);
expected_total sum_expected(std::string_view jsonl, const std::string& period, const std::string& currency,
                            const std::optional<std::string>& account = std::nullopt);

}  // namespace cg::billing
