// The scheme, host and port a client talks to ("https://api.stripe.com", "http://127.0.0.1:8080"). Pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::http {

struct origin {
    bool tls = true;
    std::string host;  // name or IP literal (IPv6 without brackets)
    std::uint16_t port = 443;

    // The value of the Host header: host, plus ":port" unless it is the scheme's default.
    std::string host_header() const;
    // "https://host:port", for logs and error messages.
    std::string to_string() const;
};

// Parses "http(s)://host[:port][/]" (IPv6 as "[::1]"). A path other than "/" is refused: the client
// addresses paths per request. Errors carry core_errc::invalid_argument.
result<origin> parse_origin(std::string_view url);

}  // namespace cg::http
