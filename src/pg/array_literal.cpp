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
// any byte inside quotes literally once unescaped). Written at the literal's exact length (escapes counted
// first), element by element.
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

std::size_t escapes(std::string_view v) {
    std::size_t n = 0;
    for (char c : v) n += (c == '"' || c == '\\') ? 1 : 0;
    return n;
}

std::size_t text_size(std::string_view v) {
    return v.size() + 2 + escapes(v);
}
std::size_t text_size(const std::optional<std::string_view>& v) {
    return v ? text_size(*v) : 4;
}

char* put_text(char* p, std::string_view v) {
    *p++ = '"';
    for (char c : v) {
        if (c == '"' || c == '\\') *p++ = '\\';
        *p++ = c;
    }
    *p++ = '"';
    return p;
}
char* put_text(char* p, const std::optional<std::string_view>& v) {
    if (v) return put_text(p, *v);
    for (char c : std::string_view("NULL")) *p++ = c;
    return p;
}

template <typename T>
std::string text_literal(std::span<const T> values) {
    std::size_t size = 2 + (values.empty() ? 0 : values.size() - 1);
    for (const auto& v : values) size += text_size(view_of(v));
    std::string out(size, '\0');
    char* p = out.data();
    *p++ = '{';
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) *p++ = ',';
        p = put_text(p, view_of(values[i]));
    }
    *p++ = '}';
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
