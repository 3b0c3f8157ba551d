#include "nsq/proto/server_codec.hpp"

namespace cg::nsq::proto {

std::vector<std::string_view> split_command(std::string_view line) {
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<std::string_view> out;
    for (;;) {
        auto sp = line.find(' ');
        out.push_back(line.substr(0, sp));
        if (sp == std::string_view::npos) break;
        line.remove_prefix(sp + 1);
    }
    return out;
}

bool command_has_body(std::string_view name) noexcept {
    return name == "IDENTIFY" || name == "PUB" || name == "MPUB" || name == "DPUB" || name == "AUTH";
}

std::optional<std::uint64_t> parse_base10(std::string_view s) noexcept {
    // Like Go's version: empty is 0 and overflow wraps.
    std::uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
}

}  // namespace cg::nsq::proto
