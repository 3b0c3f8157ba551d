// Statement parameters: values encoded as PostgreSQL text (bytea as binary), with their type OIDs, ready for
// PQsendQueryParams. Built eagerly from C++ values, so a params object owns everything it points at.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/bytes.hpp"
#include "pg/types.hpp"

namespace cg::pg {

// A SQL NULL parameter of unspecified type: `conn.query("… $1 …", pg::null)`.
struct null_t {};
inline constexpr null_t null{};

class params {
  public:
    params() = default;
    // params(a, b, c) == params().add(a).add(b).add(c)
    template <typename... A>
    requires(sizeof...(A) > 0 && !(sizeof...(A) == 1 && (std::is_same_v<std::remove_cvref_t<A>, params> &&
                                                         ...))) explicit params(A&&... a) {
        reserve(sizeof...(A));
        (add(std::forward<A>(a)), ...);
    }

    params& add(null_t);
    params& add(bool v);
    // Integers are typed by their C++ width (int16 → int2, int32 → int4, int64 → int8), so `$1` works where
    // PostgreSQL wants exactly int4 (function arguments) and `SELECT $1` comes back as the same width.
    template <std::integral I>
    requires(!std::is_same_v<I, bool> && !std::is_same_v<I, char>) params& add(I v) {
        if constexpr (std::is_unsigned_v<I> && sizeof(I) >= sizeof(std::int64_t))
            return add_text(std::to_string(v), oid::unknown);  // may not fit int8: let the server decide
        else if constexpr (sizeof(I) <= 2 && std::is_signed_v<I>)
            return add_text(std::to_string(v), oid::int2);
        else if constexpr (sizeof(I) <= 4 && (std::is_signed_v<I> || sizeof(I) < 4))
            return add_text(std::to_string(v), oid::int4);
        else
            return add_text(std::to_string(static_cast<std::int64_t>(v)), oid::int8);
    }
    // Strings go as type "unknown": the server infers the type from context (text, varchar, enum, …).
    params& add(std::string_view v) { return add_text(std::string(v), oid::unknown); }
    params& add(const std::string& v) { return add_text(v, oid::unknown); }
    params& add(std::string&& v) { return add_text(std::move(v), oid::unknown); }
    params& add(const char* v) { return add_text(std::string(v), oid::unknown); }
    params& add(timestamp t);
    // bytea, sent in binary format (no hex doubling).
    params& add(std::span<const std::uint8_t> v);
    params& add(const bytes& v) { return add(std::span<const std::uint8_t>(v)); }
    template <typename T>
    params& add(const std::optional<T>& v) {
        if (!v) return add(null);
        return add(*v);
    }

    int size() const noexcept { return static_cast<int>(values_.size()); }
    void reserve(std::size_t n);

    // Arrays for PQsendQueryParams. Pointers stay valid until the params object is modified or moved.
    const unsigned* types() const noexcept { return types_.data(); }
    const char* const* values() const;
    const int* lengths() const noexcept { return lengths_.data(); }
    const int* formats() const noexcept { return formats_.data(); }

  private:
    params& add_text(std::string v, unsigned type_oid);
    params& push(std::string v, bool is_null, unsigned type_oid, int format);

    std::vector<std::string> values_;
    std::vector<char> null_;
    std::vector<unsigned> types_;
    std::vector<int> lengths_;
    std::vector<int> formats_;
    mutable std::vector<const char*> ptrs_;  // built on demand: std::string moves invalidate pointers
};

}  // namespace cg::pg
