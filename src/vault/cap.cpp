#include "vault/cap.hpp"

#include <string>

namespace cg::vault {

result<fraction> parse_headroom(std::string_view text) {
    auto bad = [&](const char* why) {
        return error(core_errc::invalid_argument, "headroom '" + std::string(text) + "': " + why);
    };
    if (text.empty()) return bad("empty");
    fraction f{0, 1};
    bool dot = false, digits = false;
    int frac_digits = 0;
    for (char c : text) {
        if (c == '.') {
            if (dot) return bad("more than one decimal point");
            dot = true;
            continue;
        }
        if (c < '0' || c > '9') return bad("not a plain decimal number (digits and one '.')");
        digits = true;
        if (dot && ++frac_digits > 9) return bad("more than 9 decimal places");
        if (f.num > 1'000'000'000'000LL) return bad("too large");
        f.num = f.num * 10 + (c - '0');
        if (dot) f.den *= 10;
    }
    if (!digits) return bad("no digits");
    if (f.num == 0) return bad("must be greater than 0");
    if (f.num > 100 * f.den) return bad("must be at most 100");
    return f;
}

result<std::int64_t> cap_for(std::int64_t expected_cents, fraction h) {
    if (expected_cents < 0) return error(core_errc::invalid_argument, "expected total must not be negative");
    if (h.den <= 0 || h.num < 0) return error(core_errc::invalid_argument, "bad headroom fraction");
    __int128 p = static_cast<__int128>(expected_cents) * h.num / h.den;  // both ≥ 0: division floors
    if (p > INT64_MAX) return error(core_errc::out_of_range, "cap does not fit in 64 bits");
    return static_cast<std::int64_t>(p);
}

std::int64_t utilisation_bp(std::int64_t committed_cents, std::int64_t cap_cents) {
    if (cap_cents <= 0) return committed_cents > 0 ? 10000 : 0;
    return static_cast<std::int64_t>(static_cast<__int128>(committed_cents) * 10000 / cap_cents);
}

std::string format_percent_bp(std::int64_t bp) {
    std::string frac = std::to_string(bp % 100);
    if (frac.size() < 2) frac.insert(0, "0");
    return std::to_string(bp / 100) + "." + frac;
}

}  // namespace cg::vault
