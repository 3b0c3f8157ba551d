#include "nsq/proto/message.hpp"

#include <cstring>

#include "core/bytes.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/proto/frame.hpp"

namespace cg::nsq::proto {

std::size_t message_id_hash::operator()(const message_id& id) const noexcept {
    // Two 8-byte words mixed (splitmix64's finaliser): ids are sequential hex, so this spreads them well,
    // at a fraction of a byte-wise hash's cost on the per-message path (insert, FIN, TOUCH).
    std::uint64_t a, b;
    std::memcpy(&a, id.bytes.data(), 8);
    std::memcpy(&b, id.bytes.data() + 8, 8);
    std::uint64_t h = (a * 0x9E3779B97F4A7C15ull) ^ b;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return static_cast<std::size_t>(h);
}

namespace {

// Whether each of the 8 bytes of `x` is in '!'..'~' (0x21..0x7e), eight at a time: once no byte has its
// top bit set, adding 0x01 to each sets it only for 0x7f, and adding 0x5f sets it for every byte ≥ 0x21,
// with no carry between bytes in either sum.
bool printable8(std::uint64_t x) noexcept {
    constexpr std::uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    return ((x & high) | ((x + ones) & high) | (~(x + 0x5f * ones) & high)) == 0;
}

// The 16 id bytes at `p`.
bool printable_id(const char* p) noexcept {
    std::uint64_t a, b;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + 8, 8);
    return printable8(a) && printable8(b);
}

}  // namespace

bool parse_message(std::string_view data, message_view& out) noexcept {
    if (data.size() < message_header_size || !printable_id(data.data() + 10)) return false;
    const auto* p = reinterpret_cast<const std::uint8_t*>(data.data());
    out.timestamp = static_cast<std::int64_t>(load_be64(p));
    out.attempts = load_be16(p + 8);
    std::memcpy(out.id.bytes.data(), data.data() + 10, message_id_size);
    out.body = data.substr(message_header_size);
    return true;
}

result<message_view> parse_message(std::string_view data) {
    if (data.size() < message_header_size)
        return error(errc::bad_message, "message frame of " + std::to_string(data.size()) + " bytes < " +
                                            std::to_string(message_header_size));
    message_view m;
    if (!parse_message(data, m)) return error(errc::bad_message, "message id holds a non-printable byte");
    return m;
}

void append_message_frame(std::string& out, std::int64_t timestamp, std::uint16_t attempts,
                          std::string_view id, std::string_view body) {
    append_be32(out, static_cast<std::uint32_t>(4 + message_header_size + body.size()));
    append_be32(out, static_cast<std::uint32_t>(frame_type::message));
    append_be64(out, static_cast<std::uint64_t>(timestamp));
    out.push_back(static_cast<char>(attempts >> 8));
    out.push_back(static_cast<char>(attempts & 0xff));
    out.append(id.substr(0, message_id_size));
    out.append(body);
}

}  // namespace cg::nsq::proto
