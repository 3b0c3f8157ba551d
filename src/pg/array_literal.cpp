#include "pg/array_literal.hpp"

#include <string_view>

namespace cg::pg {
namespace {

// One element, always quoted: backslash and double quote escaped, everything else as is (array_in reads
// any byte inside quotes literally once unescaped).
void append_quoted(std::string& out, std::string_view v) {
    out.push_back('"');
    for (char c : v) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
    }
    out.push_back('"');
}

void append(std::string& out, const std::string& v) {
    append_quoted(out, v);
}
void append(std::string& out, const std::optional<std::string>& v) {
    if (v)
        append_quoted(out, *v);
    else
        out += "NULL";
}
void append(std::string& out, std::int64_t v) {
    out += std::to_string(v);
}
void append(std::string& out, const std::optional<std::int64_t>& v) {
    if (v)
        out += std::to_string(*v);
    else
        out += "NULL";
}

template <typename T>
std::string literal(std::span<const T> values, std::size_t reserve = 0) {
    std::string out;
    out.reserve(reserve);
    out.push_back('{');
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        append(out, values[i]);
    }
    out.push_back('}');
    return out;
}

}  // namespace

std::string text_array_literal(std::span<const std::optional<std::string>> values) {
    return literal(values);
}

std::string text_array_literal(std::span<const std::string> values) {
    std::size_t size = 2;
    for (const auto& v : values) size += v.size() + 3;
    return literal(values, size);
}

std::string int_array_literal(std::span<const std::int64_t> values) {
    return literal(values);
}

std::string int_array_literal(std::span<const std::optional<std::int64_t>> values) {
    return literal(values);
}

}  // namespace cg::pg
