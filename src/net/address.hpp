// "host:port" parsing (IPv6 in brackets). Pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::net {

struct host_port {
    std::string host;
    std::uint16_t port = 0;
    std::string to_string() const;
};

// Parses "host:port", "[v6]:port" or ":port" (host defaults to `default_host`).
result<host_port> parse_host_port(std::string_view s, std::string_view default_host = "127.0.0.1");

}  // namespace cg::net
