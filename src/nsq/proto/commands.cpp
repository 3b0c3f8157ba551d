#include "nsq/proto/commands.hpp"

#include <charconv>
#include <cstring>

#include "core/bytes.hpp"
#include "nsq/proto/message.hpp"

namespace cg::nsq::proto {
namespace {

bool valid_name(std::string_view name) noexcept {
    if (name.size() > 64) return false;
    constexpr std::string_view eph = "#ephemeral";
    if (name.size() > eph.size() && name.substr(name.size() - eph.size()) == eph)
        name.remove_suffix(eph.size());
    if (name.empty()) return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

void append_uint(std::string& out, std::uint64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

void append_line2(std::string& out, std::string_view cmd, std::string_view arg) {
    out.append(cmd);
    out.push_back(' ');
    out.append(arg);
    out.push_back('\n');
}

void append_body(std::string& out, std::string_view body) {
    append_be32(out, static_cast<std::uint32_t>(body.size()));
    out.append(body);
}

template <typename Str>
void append_mpub_impl(std::string& out, std::string_view topic, std::span<const Str> bodies) {
    append_line2(out, "MPUB", topic);
    std::size_t size = 4;
    for (const auto& b : bodies) size += 4 + b.size();
    append_be32(out, static_cast<std::uint32_t>(size));
    append_be32(out, static_cast<std::uint32_t>(bodies.size()));
    for (const auto& b : bodies) append_body(out, b);
}

}  // namespace

bool valid_topic_name(std::string_view name) noexcept {
    return valid_name(name);
}
bool valid_channel_name(std::string_view name) noexcept {
    return valid_name(name);
}

void append_magic(std::string& out) {
    out.append(magic_v2);
}

void append_identify(std::string& out, std::string_view json) {
    out.append("IDENTIFY\n");
    append_body(out, json);
}

void append_sub(std::string& out, std::string_view topic, std::string_view channel) {
    out.append("SUB ");
    out.append(topic);
    out.push_back(' ');
    out.append(channel);
    out.push_back('\n');
}

void append_rdy(std::string& out, std::uint64_t count) {
    out.append("RDY ");
    append_uint(out, count);
    out.push_back('\n');
}

void append_fin(std::string& out, std::string_view id) {
    // FIN is written once per message: a message id's line is put together here and appended in one
    // copy (a resize would zero-fill first; three appends check the capacity three times).
    if (id.size() == message_id_size) {
        char line[4 + message_id_size + 1];
        std::memcpy(line, "FIN ", 4);
        std::memcpy(line + 4, id.data(), message_id_size);
        line[4 + message_id_size] = '\n';
        out.append(line, sizeof line);
        return;
    }
    append_line2(out, "FIN", id);
}

void append_req(std::string& out, std::string_view id, std::uint64_t delay_ms) {
    out.append("REQ ");
    out.append(id);
    out.push_back(' ');
    append_uint(out, delay_ms);
    out.push_back('\n');
}

void append_touch(std::string& out, std::string_view id) {
    append_line2(out, "TOUCH", id);
}
void append_nop(std::string& out) {
    out.append("NOP\n");
}
void append_cls(std::string& out) {
    out.append("CLS\n");
}

void append_auth(std::string& out, std::string_view secret) {
    out.append("AUTH\n");
    append_body(out, secret);
}

void append_pub(std::string& out, std::string_view topic, std::string_view body) {
    append_line2(out, "PUB", topic);
    append_body(out, body);
}

void append_mpub(std::string& out, std::string_view topic, std::span<const std::string_view> bodies) {
    append_mpub_impl(out, topic, bodies);
}
void append_mpub(std::string& out, std::string_view topic, std::span<const std::string> bodies) {
    append_mpub_impl(out, topic, bodies);
}

void append_dpub(std::string& out, std::string_view topic, std::uint64_t defer_ms, std::string_view body) {
    out.append("DPUB ");
    out.append(topic);
    out.push_back(' ');
    append_uint(out, defer_ms);
    out.push_back('\n');
    append_body(out, body);
}

}  // namespace cg::nsq::proto
