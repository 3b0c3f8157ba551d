#include "stripe/webhook_event.hpp"

#include <simdjson.h>

#include <algorithm>
#include <string>
#include <vector>

#include "stripe/error.hpp"

namespace cg::stripe {
namespace {

// The first thing in `el` (recursively) that no table can hold as it is, or empty. simdjson bounds the
// depth (1024), so the recursion is bounded too.
std::string unstorable_in(simdjson::dom::element el, const std::string& where) {
    switch (el.type()) {
        case simdjson::dom::element_type::STRING: {
            std::string_view v;
            if (!el.get_string().get(v) && v.find('\0') != std::string_view::npos)
                return "a NUL character in the string at " + where;
            return {};
        }
        case simdjson::dom::element_type::ARRAY: {
            std::size_t i = 0;
            simdjson::dom::array items = el.get_array().value_unsafe();  // named: g++ -O2 -Wdangling-pointer
            for (auto item : items) {
                auto why = unstorable_in(item, where + "[" + std::to_string(i++) + "]");
                if (!why.empty()) return why;
            }
            return {};
        }
        case simdjson::dom::element_type::OBJECT: {
            std::vector<std::string_view> keys;
            simdjson::dom::object fields = el.get_object().value_unsafe();
            for (auto field : fields) {
                if (field.key.find('\0') != std::string_view::npos)
                    return "a NUL character in a key of " + where;
                keys.push_back(field.key);
                auto why = unstorable_in(field.value, where + "." + std::string(field.key));
                if (!why.empty()) return why;
            }
            std::sort(keys.begin(), keys.end());
            auto dup = std::adjacent_find(keys.begin(), keys.end());
            if (dup != keys.end()) return "the key \"" + std::string(*dup) + "\" twice in " + where;
            return {};
        }
        default:
            return {};
    }
}

// to_timestamp() and timestamptz hold far more, but no event of Stripe's was made before 1970 or after 9999.
constexpr std::int64_t latest_created = 253402300799;  // 9999-12-31T23:59:59Z

}  // namespace

result<webhook_event> parse_webhook_event(std::string_view body) {
    auto bad = [](std::string why) { return result<webhook_event>(errc::bad_response, std::move(why)); };
    thread_local simdjson::dom::parser event_parser;
    simdjson::dom::element doc;
    if (auto e = event_parser.parse(body.data(), body.size()).get(doc); e)
        return bad(std::string("not JSON: ") + simdjson::error_message(e));
    simdjson::dom::object o;
    if (doc.get_object().get(o)) return bad("not a JSON object");
    std::string_view kind, id, type;
    if (o["object"].get_string().get(kind) || kind != "event") return bad("\"object\" is not \"event\"");
    if (o["id"].get_string().get(id) || id.empty() || id.size() > 255) return bad("no usable \"id\"");
    if (o["type"].get_string().get(type) || type.empty()) return bad("no \"type\"");
    webhook_event ev;
    if (o["created"].get_int64().get(ev.created)) return bad("no integer \"created\"");
    if (auto lm = o["livemode"]; lm.error() != simdjson::NO_SUCH_FIELD && lm.get_bool().get(ev.livemode))
        return bad("\"livemode\" is not a boolean");
    simdjson::dom::object data_object;
    if (o.at_pointer("/data/object").get_object().get(data_object)) return bad("no \"data.object\"");
    std::string_view object_id;
    if (!data_object["id"].get_string().get(object_id)) ev.object_id = std::string(object_id);
    if (id.find('\0') != std::string_view::npos) return bad("no usable \"id\"");
    std::string_view api_version;
    if (!o["api_version"].get_string().get(api_version)) ev.api_version = std::string(api_version);
    ev.id = std::string(id);
    ev.type = std::string(type);
    ev.unstorable = unstorable_in(doc, "$");
    if (ev.unstorable.empty() && (ev.created < 0 || ev.created > latest_created))
        ev.unstorable = "\"created\" " + std::to_string(ev.created) + " is outside the years 1970 to 9999";
    return ev;
}

}  // namespace cg::stripe
