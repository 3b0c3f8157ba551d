// Cap arithmetic: cap = floor(expected × headroom), in integers. The headroom is parsed from its decimal
// text into an exact fraction ("1.10" → 110/100), so 1.1 never becomes 1.100000000000000088817841970012523.
// Pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/result.hpp"

namespace cg::vault {

struct fraction {
    std::int64_t num = 1;
    std::int64_t den = 1;  // a power of ten, ≥ 1
};

// "1", "1.1", "1.10", "2.5", "0.75". At most 9 fractional digits; must be > 0 and ≤ 100 (a cap above a
// hundred times the expected spend is a typo, not a budget). No sign, exponent, or spaces.
result<fraction> parse_headroom(std::string_view text);

// floor(expected_cents × h). expected ≥ 0. Fails (out_of_range) if the product does not fit in int64.
result<std::int64_t> cap_for(std::int64_t expected_cents, fraction h);

// Utilisation in basis points of a percent (9090 = 90.90 %), rounded down; 0 when cap is 0 and nothing is
// committed, 10000+ when over. Integer-only so `vault list` prints exact figures.
std::int64_t utilisation_bp(std::int64_t committed_cents, std::int64_t cap_cents);
// "90.90"
std::string format_percent_bp(std::int64_t bp);

}  // namespace cg::vault
