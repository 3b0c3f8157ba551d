#include "net/address.hpp"

#include <charconv>

#include "net/error.hpp"

namespace cg::net {

std::string host_port::to_string() const {
    if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
    return host + ":" + std::to_string(port);
}

result<host_port> parse_host_port(std::string_view s, std::string_view default_host) {
    auto bad = [&] { return error(errc::bad_address, "'" + std::string(s) + "'"); };
    host_port hp;
    std::string_view port;
    if (!s.empty() && s.front() == '[') {
        auto close = s.find(']');
        if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') return bad();
        hp.host = std::string(s.substr(1, close - 1));
        port = s.substr(close + 2);
    } else {
        auto colon = s.rfind(':');
        if (colon == std::string_view::npos) return bad();
        if (s.substr(0, colon).find(':') != std::string_view::npos) return bad();
        hp.host = std::string(s.substr(0, colon));
        port = s.substr(colon + 1);
    }
    if (hp.host.empty()) hp.host = std::string(default_host);
    unsigned v = 0;
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
    if (port.empty() || ec != std::errc{} || p != port.data() + port.size() || v > 65535) return bad();
    hp.port = static_cast<std::uint16_t>(v);
    return hp;
}

}  // namespace cg::net
