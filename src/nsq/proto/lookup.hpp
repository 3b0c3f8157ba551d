// nsqlookupd's /lookup?topic= reply. Pure (simdjson).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"

namespace cg::nsq::proto {

struct producer_info {
    std::string broadcast_address;
    std::string hostname;
    std::string remote_address;
    std::uint16_t tcp_port = 0;
    std::uint16_t http_port = 0;
    std::string version;
    // "broadcast_address:tcp_port" (IPv6 in brackets): the key connections are deduplicated on.
    std::string key() const;
};

// Accepts the v1 body {"channels":[…],"producers":[…]} and the pre-1.0 {"status_code":…,"data":{…}} one.
result<std::vector<producer_info>> parse_lookup_response(std::string_view body);
// The body nsqlookupd 1.3.0 writes (fake-nsqlookupd).
std::string to_lookup_json(const std::vector<std::string>& channels,
                           const std::vector<producer_info>& producers);

}  // namespace cg::nsq::proto
