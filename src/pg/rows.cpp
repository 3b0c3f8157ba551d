#include "pg/rows.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <limits>

namespace cg::pg {

void rows::deleter::operator()(pg_result* r) const noexcept {
    PQclear(r);
}

rows::rows(pg_result* res) noexcept : res_(res) {}

std::size_t rows::size() const noexcept {
    return res_ ? static_cast<std::size_t>(PQntuples(res_.get())) : 0;
}

int rows::columns() const noexcept {
    return res_ ? PQnfields(res_.get()) : 0;
}

std::string_view rows::column_name(int col) const {
    const char* n = res_ ? PQfname(res_.get(), col) : nullptr;
    if (!n) throw column_error("column " + std::to_string(col) + " out of range");
    return n;
}

int rows::column(std::string_view name) const {
    std::string n(name);
    int c = res_ ? PQfnumber(res_.get(), n.c_str()) : -1;
    if (c < 0) throw column_error("no column \"" + n + "\" in the result");
    return c;
}

std::int64_t rows::affected() const noexcept {
    if (!res_) return 0;
    return parse_int64(PQcmdTuples(res_.get())).value_or(0);
}

std::string_view rows::command() const noexcept {
    return res_ ? PQcmdStatus(res_.get()) : "";
}

bool rows::is_null(std::size_t row, int col) const {
    if (row >= size() || col < 0 || col >= columns())
        throw column_error("row " + std::to_string(row) + " column " + std::to_string(col) + " out of range");
    return PQgetisnull(res_.get(), static_cast<int>(row), col) != 0;
}

std::string_view rows::text(std::size_t row, int col) const {
    if (is_null(row, col)) return {};
    return value(row, col);
}

std::string_view rows::text_checked(std::size_t r, int c) const {
    if (is_null(r, c)) fail(r, c, "is NULL (read it as std::optional)");
    return value(r, c);
}

std::string_view rows::value(std::size_t r, int c) const {
    return {PQgetvalue(res_.get(), static_cast<int>(r), c),
            static_cast<std::size_t>(PQgetlength(res_.get(), static_cast<int>(r), c))};
}

void rows::fail(std::size_t r, int c, const char* what) const {
    std::string name = c >= 0 && c < columns() ? std::string(column_name(c)) : std::to_string(c);
    throw column_error("row " + std::to_string(r) + " column \"" + name + "\" " + what);
}

void rows::expect_type(int c, std::initializer_list<unsigned> oids, const char* what) const {
    auto t = PQftype(res_.get(), c);
    if (std::find(oids.begin(), oids.end(), t) == oids.end())
        throw column_error("column \"" + std::string(column_name(c)) + "\" has type oid " +
                           std::to_string(t) + ", not " + what);
}

template <typename Parse>
auto rows::parsed(std::size_t r, int c, std::initializer_list<unsigned> oids, const char* type_name,
                  Parse parse, const char* bad) const {
    auto s = text_checked(r, c);
    expect_type(c, oids, type_name);
    auto v = parse(s);
    if (!v) fail(r, c, bad);
    return std::move(*v);
}

std::int64_t rows::decode(std::size_t r, int c, tag<std::int64_t>) const {
    return parsed(r, c, {oid::int8, oid::int4, oid::int2, oid::oid}, "an integer", parse_int64,
                  "is not an integer");
}

std::int32_t rows::decode(std::size_t r, int c, tag<std::int32_t>) const {
    auto v = decode(r, c, tag<std::int64_t>{});
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
        fail(r, c, "does not fit in 32 bits");
    return static_cast<std::int32_t>(v);
}

bool rows::decode(std::size_t r, int c, tag<bool>) const {
    return parsed(r, c, {oid::bool_}, "boolean", parse_bool, "is not a boolean");
}

timestamp rows::decode(std::size_t r, int c, tag<timestamp>) const {
    return parsed(r, c, {oid::timestamptz}, "timestamptz", parse_timestamptz,
                  "is not an ISO timestamptz (infinity?)");
}

bytes rows::decode(std::size_t r, int c, tag<bytes>) const {
    return parsed(r, c, {oid::bytea}, "bytea", parse_bytea_hex, "is not hex bytea");
}

}  // namespace cg::pg
