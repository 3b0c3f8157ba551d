// Client → server command encoders (text line, optional [size:int32][body]) and name validation. Pure:
// each function appends the wire form to `out`; callers validate names and ids first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace cg::nsq::proto {

inline constexpr std::string_view magic_v2 = "  V2";

// [.a-zA-Z0-9_-]{1,64}, optionally ending in "#ephemeral" (within the 64).
bool valid_topic_name(std::string_view name) noexcept;
bool valid_channel_name(std::string_view name) noexcept;

void append_magic(std::string& out);
void append_identify(std::string& out, std::string_view json);
void append_sub(std::string& out, std::string_view topic, std::string_view channel);
void append_rdy(std::string& out, std::uint64_t count);
void append_fin(std::string& out, std::string_view id);
void append_req(std::string& out, std::string_view id, std::uint64_t delay_ms);
void append_touch(std::string& out, std::string_view id);
void append_nop(std::string& out);
void append_cls(std::string& out);
void append_auth(std::string& out, std::string_view secret);
void append_pub(std::string& out, std::string_view topic, std::string_view body);
// MPUB body: [num:int32]([size:int32][body])*.
void append_mpub(std::string& out, std::string_view topic, std::span<const std::string_view> bodies);
void append_mpub(std::string& out, std::string_view topic, std::span<const std::string> bodies);
void append_dpub(std::string& out, std::string_view topic, std::uint64_t defer_ms, std::string_view body);

}  // namespace cg::nsq::proto
