#include "nsq/proto/message.hpp"

#include <cstring>

#include "core/bytes.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/proto/frame.hpp"

namespace cg::nsq::proto {

std::size_t message_id_hash::operator()(const message_id& id) const noexcept {
    // FNV-1a over 16 bytes: ids are sequential hex, so a plain mix is enough.
    std::uint64_t h = 1469598103934665603ull;
    for (char c : id.bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
}

result<message_view> parse_message(std::string_view data) {
    if (data.size() < message_header_size)
        return error(errc::bad_message, "message frame of " + std::to_string(data.size()) + " bytes < " +
                                            std::to_string(message_header_size));
    const auto* p = reinterpret_cast<const std::uint8_t*>(data.data());
    message_view m;
    m.timestamp = static_cast<std::int64_t>(load_be64(p));
    m.attempts = load_be16(p + 8);
    std::memcpy(m.id.bytes.data(), data.data() + 10, message_id_size);
    for (char c : m.id.bytes) {
        if (c <= ' ' || c > '~') return error(errc::bad_message, "message id holds a non-printable byte");
    }
    m.body = data.substr(message_header_size);
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
