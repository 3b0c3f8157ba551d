// The rows of one statement's result, with typed accessors. Owns libpq's PGresult (no libpq include here).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "core/bytes.hpp"
#include "pg/types.hpp"

struct pg_result;  // libpq's PGresult

namespace cg::pg {

// Thrown by rows::get when a column's type or nullness does not match what the code asked for: the SQL and
// the code disagree, a bug (docs/contributing.md "Errors": broken invariants throw).
class column_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

class rows {
  public:
    rows() = default;
    explicit rows(pg_result* res) noexcept;  // takes ownership

    std::size_t size() const noexcept;
    bool empty() const noexcept { return size() == 0; }
    int columns() const noexcept;
    std::string_view column_name(int col) const;
    // The position of the column named `name` (PQfnumber: case-folded unless double-quoted); throws
    // column_error when the result has none, so a reader that selects extra columns names them rather than
    // counting.
    int column(std::string_view name) const;
    // Rows inserted/updated/deleted (or returned by SELECT), from the command tag; 0 when not applicable.
    std::int64_t affected() const noexcept;
    // The command tag, e.g. "INSERT 0 1".
    std::string_view command() const noexcept;

    bool is_null(std::size_t row, int col) const;
    // The raw text of a value ("" for NULL).
    std::string_view text(std::size_t row, int col) const;

    // Typed value. T: std::int64_t, std::int32_t, bool, std::string, std::string_view (valid while *this
    // lives), timestamp, bytes, or std::optional of those for nullable columns. Throws column_error on a type
    // mismatch, a NULL in a non-optional, or an index out of range.
    template <typename T>
    T get(std::size_t row, int col) const {
        if constexpr (is_optional<T>::value) {
            if (is_null(row, col)) return std::nullopt;
            return get<typename T::value_type>(row, col);
        } else {
            return decode(row, col, tag<T>{});
        }
    }

    class row_ref {
      public:
        row_ref(const rows& r, std::size_t i) : r_(&r), i_(i) {}
        template <typename T>
        T get(int col) const {
            return r_->get<T>(i_, col);
        }
        bool is_null(int col) const { return r_->is_null(i_, col); }
        // The first sizeof...(T) columns as a tuple: auto [id, name] = row.as<std::int64_t, std::string>();
        template <typename... T>
        std::tuple<T...> as() const {
            return as_impl<T...>(std::index_sequence_for<T...>{});
        }

      private:
        template <typename... T, std::size_t... I>
        std::tuple<T...> as_impl(std::index_sequence<I...>) const {
            return std::tuple<T...>(r_->get<T>(i_, static_cast<int>(I))...);
        }
        const rows* r_;
        std::size_t i_;
    };
    row_ref operator[](std::size_t i) const { return row_ref(*this, i); }

  private:
    template <typename T>
    struct tag {};
    std::int64_t decode(std::size_t r, int c, tag<std::int64_t>) const;
    std::int32_t decode(std::size_t r, int c, tag<std::int32_t>) const;
    bool decode(std::size_t r, int c, tag<bool>) const;
    std::string decode(std::size_t r, int c, tag<std::string>) const {
        return std::string(text_checked(r, c));
    }
    std::string_view decode(std::size_t r, int c, tag<std::string_view>) const { return text_checked(r, c); }
    timestamp decode(std::size_t r, int c, tag<timestamp>) const;
    bytes decode(std::size_t r, int c, tag<bytes>) const;

    // The value's text; throws on NULL or a bad index.
    std::string_view text_checked(std::size_t r, int c) const;
    // The value's text, index and NULL already checked.
    std::string_view value(std::size_t r, int c) const;
    void expect_type(int c, std::initializer_list<unsigned> oids, const char* what) const;
    // text_checked, expect_type(oids, type_name), then `parse` (text → optional value); `bad` when it fails.
    template <typename Parse>
    auto parsed(std::size_t r, int c, std::initializer_list<unsigned> oids, const char* type_name,
                Parse parse, const char* bad) const;
    [[noreturn]] void fail(std::size_t r, int c, const char* what) const;

    struct deleter {
        void operator()(pg_result* r) const noexcept;
    };
    std::unique_ptr<pg_result, deleter> res_;
};

}  // namespace cg::pg
