#include "stripe/webhook_event.hpp"

#include <simdjson.h>

#include "stripe/error.hpp"

namespace cg::stripe {

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
    ev.id = std::string(id);
    ev.type = std::string(type);
    return ev;
}

}  // namespace cg::stripe
