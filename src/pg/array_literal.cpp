#include "pg/array_literal.hpp"

#include <charconv>
#include <string_view>

namespace cg::pg {
namespace {

void append(std::string& out, std::int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}
void append(std::string& out, const std::optional<std::int64_t>& v) {
    if (v)
        append(out, *v);
    else
        out += "NULL";
}

template <typename T>
std::string int_literal(std::span<const T> values) {
    std::string out;
    out.reserve(2 + 12 * values.size());
    out.push_back('{');
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        append(out, values[i]);
    }
    out.push_back('}');
    return out;
}

// Text elements are always quoted: backslash and double quote escaped, everything else as is (array_in reads
// any byte inside quotes literally once unescaped); NULL is bare.
std::string_view view_of(std::string_view v) {
    return v;
}
std::string_view view_of(const std::string& v) {
    return v;
}
std::optional<std::string_view> view_of(const std::optional<std::string>& v) {
    if (!v) return std::nullopt;
    return std::string_view(*v);
}
std::optional<std::string_view> view_of(const std::optional<std::string_view>& v) {
    return v;
}

std::size_t unescaped_size(std::string_view v) {
    return v.size() + 2;
}
std::size_t unescaped_size(const std::optional<std::string_view>& v) {
    return v ? unescaped_size(*v) : 4;
}

void append_text(std::string& out, std::string_view v) {
    out.push_back('"');
    for (char c : v) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
    }
    out.push_back('"');
}
void append_text(std::string& out, const std::optional<std::string_view>& v) {
    if (v)
        append_text(out, *v);
    else
        out += "NULL";
}

// Reserved for the elements and their separators without escapes (rare: a literal with some grows once).
template <typename T>
std::string text_literal(std::span<const T> values) {
    std::size_t size = 2 + values.size();
    for (const auto& v : values) size += unescaped_size(view_of(v));
    std::string out;
    out.reserve(size);
    out.push_back('{');
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        append_text(out, view_of(values[i]));
    }
    out.push_back('}');
    return out;
}

}  // namespace

std::string text_array_literal(std::span<const std::optional<std::string>> values) {
    return text_literal(values);
}

std::string text_array_literal(std::span<const std::string> values) {
    return text_literal(values);
}

std::string text_array_literal(std::span<const std::optional<std::string_view>> values) {
    return text_literal(values);
}

std::string text_array_literal(std::span<const std::string_view> values) {
    return text_literal(values);
}

std::string int_array_literal(std::span<const std::int64_t> values) {
    return int_literal(values);
}

std::string int_array_literal(std::span<const std::optional<std::int64_t>> values) {
    return int_literal(values);
}

}  // namespace cg::pg
