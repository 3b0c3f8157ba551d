// Message frame data: [timestamp:int64 ns][attempts:uint16][id:16 ASCII bytes][body]. Pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::nsq::proto {

inline constexpr std::size_t message_id_size = 16;
inline constexpr std::size_t message_header_size = 8 + 2 + message_id_size;

// A message id: 16 ASCII bytes (nsqd sends hex). Fixed size so it can be a hash key without allocating.
struct message_id {
    std::array<char, message_id_size> bytes{};
    std::string_view view() const noexcept { return {bytes.data(), bytes.size()}; }
    friend bool operator==(const message_id&, const message_id&) = default;
};
struct message_id_hash {
    std::size_t operator()(const message_id& id) const noexcept;
};

// A parsed message frame; `id` and `body` view the frame data.
struct message_view {
    std::int64_t timestamp = 0;  // ns since the epoch, set at publish time
    std::uint16_t attempts = 0;  // 1 on first delivery
    message_id id;
    std::string_view body;
};

// Fails with bad_message when the data is shorter than the header or the id holds bytes that would break
// a command line (space, control characters, non-ASCII): echoing such an id in FIN would inject commands.
result<message_view> parse_message(std::string_view data);
// The same check without building an error (the per-message path): false where the above fails.
bool parse_message(std::string_view data, message_view& out) noexcept;

// Builds a message frame (server side: fake-nsqd, tests).
void append_message_frame(std::string& out, std::int64_t timestamp, std::uint16_t attempts,
                          std::string_view id, std::string_view body);

}  // namespace cg::nsq::proto
