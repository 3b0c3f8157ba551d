// The server half of the protocol, for fake-nsqd (and the fuzzer): splitting a command line into
// parameters the way nsqd does, and parsing message ids and integer arguments with nsqd's rules. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace cg::nsq::proto {

// nsqd reads a command with ReadSlice('\n') on a 16 KiB bufio.Reader: longer lines fail.
inline constexpr std::size_t max_command_line = 16 * 1024;

// Strips "\n" and an optional "\r", then splits on single spaces (bytes.Split semantics: empty
// parameters are kept).
std::vector<std::string_view> split_command(std::string_view line);

// True when the command is followed by [size:int32][body].
bool command_has_body(std::string_view name) noexcept;

// protocol.ByteToBase10: decimal digits only (no sign), nullopt otherwise; "" is 0, overflow wraps.
std::optional<std::uint64_t> parse_base10(std::string_view s) noexcept;

}  // namespace cg::nsq::proto
