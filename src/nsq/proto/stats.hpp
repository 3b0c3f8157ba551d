// nsqd's /stats?format=json&topic=T&channel=C reply (nsqd 1.3.0: {"version":…,"health":…,"start_time":…,
// "topics":[{"topic_name":…,"channels":[{"channel_name":…,"depth":…,"backend_depth":…,…}],…}],…}; pre-1.0
// nsqd wrapped it in {"status_code":…,"data":{…}}). Pure (simdjson).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/result.hpp"

namespace cg::nsq::proto {

// The channel's `depth`: the messages queued at this nsqd, in memory and on disk (nsqd counts
// backend_depth in it), not those in flight or deferred. nullopt: the topic or the channel does not exist
// there (yet). An error: not such a reply.
result<std::optional<std::int64_t>> parse_channel_depth(std::string_view body, std::string_view topic,
                                                        std::string_view channel);

}  // namespace cg::nsq::proto
