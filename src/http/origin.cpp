#include "http/origin.hpp"

#include <charconv>

namespace cg::http {

std::string origin::host_header() const {
    std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    if (port != (tls ? 443 : 80)) h += ":" + std::to_string(port);
    return h;
}

std::string origin::to_string() const {
    return (tls ? "https://" : "http://") + host_header();
}

result<origin> parse_origin(std::string_view url) {
    origin o;
    if (url.starts_with("https://")) {
        o.tls = true;
        o.port = 443;
        url.remove_prefix(8);
    } else if (url.starts_with("http://")) {
        o.tls = false;
        o.port = 80;
        url.remove_prefix(7);
    } else {
        return error(core_errc::invalid_argument,
                     "URL must start with http:// or https://: '" + std::string(url) + "'");
    }
    if (auto slash = url.find('/'); slash != std::string_view::npos) {
        if (url.substr(slash) != "/")
            return error(core_errc::invalid_argument,
                         "base URL must not carry a path: '" + std::string(url) + "'");
        url = url.substr(0, slash);
    }
    std::string_view port_part;
    if (url.starts_with('[')) {
        auto close = url.find(']');
        if (close == std::string_view::npos)
            return error(core_errc::invalid_argument, "unterminated IPv6 literal");
        o.host = std::string(url.substr(1, close - 1));
        auto rest = url.substr(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':') return error(core_errc::invalid_argument, "junk after IPv6 literal");
            port_part = rest.substr(1);
        }
    } else {
        auto colon = url.find(':');
        o.host = std::string(url.substr(0, colon));
        if (colon != std::string_view::npos) port_part = url.substr(colon + 1);
    }
    if (o.host.empty()) return error(core_errc::invalid_argument, "URL has no host");
    if (!port_part.empty() || url.ends_with(':')) {
        unsigned p = 0;
        auto [ptr, ec] = std::from_chars(port_part.data(), port_part.data() + port_part.size(), p);
        if (ec != std::errc{} || ptr != port_part.data() + port_part.size() || p == 0 || p > 65535)
            return error(core_errc::invalid_argument, "bad port '" + std::string(port_part) + "'");
        o.port = static_cast<std::uint16_t>(p);
    }
    return o;
}

}  // namespace cg::http
