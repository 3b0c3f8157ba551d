#include "core/bytes.hpp"

namespace cg {
namespace {

int hex_value(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

char lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

std::string to_hex(std::span<const std::uint8_t> in) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.resize(in.size() * 2);
    for (std::size_t i = 0; i < in.size(); ++i) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0xf];
    }
    return out;
}

std::optional<bytes> from_hex(std::string_view in) {
    if (in.size() % 2 != 0) return std::nullopt;
    bytes out(in.size() / 2);
    for (std::size_t i = 0; i < out.size(); ++i) {
        int hi = hex_value(in[2 * i]);
        int lo = hex_value(in[2 * i + 1]);
        if (hi < 0 || lo < 0) return std::nullopt;
        out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
    }
    return out;
}

void append_be32(std::string& out, std::uint32_t v) {
    std::uint8_t b[4];
    store_be32(b, v);
    out.append(reinterpret_cast<const char*>(b), 4);
}

void append_be64(std::string& out, std::uint64_t v) {
    std::uint8_t b[8];
    store_be64(b, v);
    out.append(reinterpret_cast<const char*>(b), 8);
}

bool iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (lower(a[i]) != lower(b[i])) return false;
    return true;
}

}  // namespace cg
