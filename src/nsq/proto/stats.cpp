#include "nsq/proto/stats.hpp"

#include <simdjson.h>

#include <string>

#include "nsq/proto/error.hpp"

namespace cg::nsq::proto {

result<std::optional<std::int64_t>> parse_channel_depth(std::string_view body, std::string_view topic,
                                                        std::string_view channel) {
    using out = result<std::optional<std::int64_t>>;
    auto bad = [](std::string m) { return out(error(errc::bad_response, "nsqd /stats: " + std::move(m))); };
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(body.data(), body.size()).get(doc) != simdjson::SUCCESS) return bad("invalid JSON");
    simdjson::dom::element data;
    if (doc.at_key("data").get(data) == simdjson::SUCCESS && data.is_object()) doc = data;
    simdjson::dom::array topics;
    if (doc.at_key("topics").get(topics) != simdjson::SUCCESS) return bad("no topics array");
    for (simdjson::dom::element t : topics) {
        std::string_view name;
        if (t.at_key("topic_name").get(name) != simdjson::SUCCESS) return bad("a topic without topic_name");
        if (name != topic) continue;
        simdjson::dom::array channels;
        if (t.at_key("channels").get(channels) != simdjson::SUCCESS) return bad("a topic without channels");
        for (simdjson::dom::element c : channels) {
            std::string_view cname;
            if (c.at_key("channel_name").get(cname) != simdjson::SUCCESS)
                return bad("a channel without channel_name");
            if (cname != channel) continue;
            std::int64_t depth = 0;
            if (c.at_key("depth").get(depth) != simdjson::SUCCESS || depth < 0)
                return bad("a channel without a depth");
            return out(std::optional<std::int64_t>(depth));
        }
    }
    return out(std::optional<std::int64_t>());
}

}  // namespace cg::nsq::proto
