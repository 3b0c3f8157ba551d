// Byte helpers: hex encoding and big-endian integers. Pure, std only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cg {

using bytes = std::vector<std::uint8_t>;

// Lower-case hex of the input bytes.
std::string to_hex(std::span<const std::uint8_t> in);
inline std::string to_hex(std::string_view in) {
    return to_hex(std::span(reinterpret_cast<const std::uint8_t*>(in.data()), in.size()));
}
// Decodes hex (either case); nullopt on odd length or a non-hex digit.
std::optional<bytes> from_hex(std::string_view in);

inline std::uint16_t load_be16(const std::uint8_t* p) noexcept {
    return static_cast<std::uint16_t>((std::uint16_t{p[0]} << 8) | p[1]);
}
inline std::uint32_t load_be32(const std::uint8_t* p) noexcept {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
inline std::uint64_t load_be64(const std::uint8_t* p) noexcept {
    return (std::uint64_t{load_be32(p)} << 32) | load_be32(p + 4);
}
inline void store_be32(std::uint8_t* p, std::uint32_t v) noexcept {
    p[0] = static_cast<std::uint8_t>(v >> 24);
    p[1] = static_cast<std::uint8_t>(v >> 16);
    p[2] = static_cast<std::uint8_t>(v >> 8);
    p[3] = static_cast<std::uint8_t>(v);
}
inline void store_be64(std::uint8_t* p, std::uint64_t v) noexcept {
    store_be32(p, static_cast<std::uint32_t>(v >> 32));
    store_be32(p + 4, static_cast<std::uint32_t>(v));
}
// Appends a big-endian integer to a byte string.
void append_be32(std::string& out, std::uint32_t v);
void append_be64(std::string& out, std::uint64_t v);

// Case-insensitive ASCII comparison (HTTP header names and the like).
bool iequals(std::string_view a, std::string_view b) noexcept;

}  // namespace cg
