#include "nsq/proto/lookup.hpp"

#include <simdjson.h>

#include "core/log.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq::proto {

std::string producer_info::key() const {
    if (broadcast_address.find(':') != std::string::npos)
        return "[" + broadcast_address + "]:" + std::to_string(tcp_port);
    return broadcast_address + ":" + std::to_string(tcp_port);
}

result<std::vector<producer_info>> parse_lookup_response(std::string_view body) {
    auto bad = [](std::string m) { return error(errc::bad_response, "lookupd: " + std::move(m)); };
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(body.data(), body.size()).get(doc) != simdjson::SUCCESS) return bad("invalid JSON");
    simdjson::dom::element data;
    if (doc.at_key("data").get(data) == simdjson::SUCCESS && data.is_object()) doc = data;
    simdjson::dom::array producers;
    if (doc.at_key("producers").get(producers) != simdjson::SUCCESS) return bad("no producers array");
    std::vector<producer_info> out;
    for (simdjson::dom::element e : producers) {
        producer_info pi;
        std::string_view s;
        std::uint64_t port = 0;
        if (e.at_key("broadcast_address").get(s) != simdjson::SUCCESS || s.empty())
            return bad("producer without broadcast_address");
        pi.broadcast_address.assign(s);
        if (e.at_key("tcp_port").get(port) != simdjson::SUCCESS || port == 0 || port > 65535)
            return bad("producer without a valid tcp_port");
        pi.tcp_port = static_cast<std::uint16_t>(port);
        if (e.at_key("http_port").get(port) == simdjson::SUCCESS && port <= 65535)
            pi.http_port = static_cast<std::uint16_t>(port);
        if (e.at_key("hostname").get(s) == simdjson::SUCCESS) pi.hostname.assign(s);
        if (e.at_key("remote_address").get(s) == simdjson::SUCCESS) pi.remote_address.assign(s);
        if (e.at_key("version").get(s) == simdjson::SUCCESS) pi.version.assign(s);
        out.push_back(std::move(pi));
    }
    return out;
}

std::string to_lookup_json(const std::vector<std::string>& channels,
                           const std::vector<producer_info>& producers) {
    std::string out = "{\"channels\":[";
    for (std::size_t i = 0; i < channels.size(); ++i) {
        if (i) out.push_back(',');
        append_json_string(out, channels[i]);
    }
    out += "],\"producers\":[";
    for (std::size_t i = 0; i < producers.size(); ++i) {
        const auto& p = producers[i];
        if (i) out.push_back(',');
        out += "{\"remote_address\":";
        append_json_string(out, p.remote_address);
        out += ",\"hostname\":";
        append_json_string(out, p.hostname);
        out += ",\"broadcast_address\":";
        append_json_string(out, p.broadcast_address);
        out += ",\"tcp_port\":" + std::to_string(p.tcp_port) +
               ",\"http_port\":" + std::to_string(p.http_port) + ",\"version\":";
        append_json_string(out, p.version);
        out.push_back('}');
    }
    out += "]}";
    return out;
}

}  // namespace cg::nsq::proto
