// libFuzzer target for the Stripe webhook event envelope reader (the body of a delivery, after its
// signature passed): arbitrary bodies must never crash; an envelope that reads has an id of 1..255
// bytes and a type; written back as JSON (core/log's string escaping) it reads as the same envelope.
// Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "check.hpp"
#include "core/log.hpp"
#include "stripe/webhook_event.hpp"

using namespace cg::stripe;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view body(reinterpret_cast<const char*>(data), size);
    auto ev = parse_webhook_event(body);
    if (!ev) {
        FUZZ_CHECK(!ev.err().message.empty());
        return 0;
    }
    FUZZ_CHECK(!ev->id.empty() && ev->id.size() <= 255 && !ev->type.empty());
    std::string out = "{\"id\":";
    cg::append_json_string(out, ev->id);
    out += ",\"object\":\"event\",\"type\":";
    cg::append_json_string(out, ev->type);
    out += ",\"created\":" + std::to_string(ev->created);
    out += ev->livemode ? ",\"livemode\":true" : ",\"livemode\":false";
    out += ",\"data\":{\"object\":{";
    if (!ev->object_id.empty()) {
        out += "\"id\":";
        cg::append_json_string(out, ev->object_id);
    }
    out += "}}}";
    auto again = parse_webhook_event(out);
    FUZZ_CHECK(again);
    FUZZ_CHECK(again->id == ev->id && again->type == ev->type && again->created == ev->created &&
               again->livemode == ev->livemode && again->object_id == ev->object_id);
    return 0;
}
