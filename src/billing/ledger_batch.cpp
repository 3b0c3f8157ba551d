#include "billing/ledger_batch.hpp"

namespace cg::billing {
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

}  // namespace

std::string text_array_literal(std::span<const std::optional<std::string>> values) {
    std::string out = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        if (values[i])
            append_quoted(out, *values[i]);
        else
            out += "NULL";
    }
    out.push_back('}');
    return out;
}

std::string text_array_literal(std::span<const std::string> values) {
    std::size_t size = 2;
    for (const auto& v : values) size += v.size() + 3;
    std::string out;
    out.reserve(size);
    out.push_back('{');
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        append_quoted(out, values[i]);
    }
    out.push_back('}');
    return out;
}

std::string int_array_literal(std::span<const std::int64_t> values) {
    std::string out = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out.push_back(',');
        out += std::to_string(values[i]);
    }
    out.push_back('}');
    return out;
}

}  // namespace cg::billing
