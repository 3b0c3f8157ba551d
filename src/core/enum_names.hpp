// One table of an enum's names, read both ways, for the enums that are parsed as well as printed (a
// ledger status read back from PostgreSQL, a flag's value): name() and parse() come from the same list, so
// they cannot disagree. Enums only ever printed keep a switch, whose -Wswitch names a value left out.
// Constexpr; pure.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace cg {

template <typename E, std::size_t N>
class enum_names {
  public:
    using entry = std::pair<E, std::string_view>;
    constexpr explicit enum_names(std::array<entry, N> table) : table_(table) {}

    // `v`'s name; `unknown` for a value the table does not hold.
    constexpr std::string_view name(E v, std::string_view unknown = "?") const noexcept {
        for (const auto& [value, n] : table_)
            if (value == v) return n;
        return unknown;
    }
    // The value named exactly `s`.
    constexpr std::optional<E> parse(std::string_view s) const noexcept {
        for (const auto& [value, n] : table_)
            if (n == s) return value;
        return std::nullopt;
    }
    constexpr const std::array<entry, N>& entries() const noexcept { return table_; }

  private:
    std::array<entry, N> table_;
};

}  // namespace cg
