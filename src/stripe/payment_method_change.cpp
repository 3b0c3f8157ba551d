#include "stripe/payment_method_change.hpp"

#include <simdjson.h>

namespace cg::stripe {
namespace {

// The string at `key` of `obj`, or empty (absent, null or not a string).
std::string string_at(simdjson::dom::object obj, std::string_view key) {
    std::string_view v;
    if (obj[key].get_string().get(v) != simdjson::SUCCESS) return {};
    return std::string(v);
}

payment_method_change no_change(std::string why) {
    payment_method_change c;
    c.why_not = std::move(why);
    return c;
}

}  // namespace

bool names_payment_method_change(std::string_view type) noexcept {
    return type == "payment_method.attached" || type == "customer.updated";
}

payment_method_change read_payment_method_change(std::string_view body) {
    thread_local simdjson::dom::parser parser;
    simdjson::padded_string padded(body);
    simdjson::dom::object ev;
    if (parser.parse(padded).get_object().get(ev) != simdjson::SUCCESS) return no_change("not a JSON object");
    const std::string type = string_at(ev, "type");
    if (!names_payment_method_change(type)) return no_change("the event type " + type + " is not one");
    simdjson::dom::object data, object;
    if (ev["data"].get_object().get(data) != simdjson::SUCCESS ||
        data["object"].get_object().get(object) != simdjson::SUCCESS)
        return no_change("no data.object");
    payment_method_change c;
    c.account = string_at(ev, "account");
    if (type == "payment_method.attached") {
        if (string_at(object, "object") != "payment_method")
            return no_change("data.object is no payment_method");
        c.customer = string_at(object, "customer");
        c.payment_method = string_at(object, "id");
        if (c.customer.empty()) return no_change("the payment method names no customer");
        return c;
    }
    if (string_at(object, "object") != "customer") return no_change("data.object is no customer");
    simdjson::dom::object previous, previous_settings, settings;
    if (data["previous_attributes"].get_object().get(previous) != simdjson::SUCCESS ||
        previous["invoice_settings"].get_object().get(previous_settings) != simdjson::SUCCESS)
        return no_change("invoice_settings did not change");
    simdjson::dom::element before;
    if (previous_settings["default_payment_method"].get(before) != simdjson::SUCCESS)
        return no_change("invoice_settings.default_payment_method did not change");
    if (object["invoice_settings"].get_object().get(settings) != simdjson::SUCCESS)
        return no_change("the customer has no invoice_settings");
    c.payment_method = string_at(settings, "default_payment_method");
    if (c.payment_method.empty()) return no_change("the default payment method was removed");
    std::string_view was;
    if (before.get_string().get(was) == simdjson::SUCCESS && was == c.payment_method)
        return no_change("the default payment method is the one it was");
    c.customer = string_at(object, "id");
    if (c.customer.empty()) return no_change("the customer has no id");
    return c;
}

}  // namespace cg::stripe
