#include "stripe/refunds.hpp"

#include <simdjson.h>

#include "http/proto/message.hpp"
#include "stripe/client.hpp"
#include "stripe/error.hpp"
#include "stripe/form.hpp"

namespace cg::stripe {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

std::string rf_str(object o, std::string_view key) {
    std::string_view s;
    if (o[key].get_string().get(s)) return {};
    return std::string(s);
}

std::string rf_id_or_object(object o, std::string_view key) {
    element e;
    if (o[key].get(e)) return {};
    std::string_view s;
    if (!e.get_string().get(s)) return std::string(s);
    object inner;
    if (!e.get_object().get(inner)) return rf_str(inner, "id");
    return {};
}

result<refund> rf_to_refund(object o) {
    refund r;
    r.id = rf_str(o, "id");
    if (r.id.empty() || rf_str(o, "object") != "refund")
        return error(errc::bad_response, "not a refund object");
    std::int64_t n = 0;
    if (!o["amount"].get_int64().get(n)) r.amount = n;
    if (!o["created"].get_int64().get(n)) r.created = n;
    r.charge = rf_id_or_object(o, "charge");
    r.payment_intent = rf_id_or_object(o, "payment_intent");
    r.currency = rf_str(o, "currency");
    r.status = rf_str(o, "status");
    object m;
    if (!o["metadata"].get_object().get(m))
        for (auto field : m) {
            std::string_view v;
            if (!field.value.get_string().get(v))
                r.metadata.emplace_back(std::string(field.key), std::string(v));
        }
    return r;
}

result<object> rf_parse_object(simdjson::dom::parser& p, std::string_view body) {
    element doc;
    if (auto e = p.parse(body.data(), body.size()).get(doc); e)
        return error(errc::bad_response, std::string("JSON: ") + simdjson::error_message(e));
    object o;
    if (doc.get_object().get(o)) return error(errc::bad_response, "JSON body is not an object");
    return o;
}

errc rf_errc_for(outcome_class c) {
    switch (c) {
        case outcome_class::succeeded:
            return errc::ok;
        case outcome_class::declined:
            return errc::declined;
        case outcome_class::cap_exceeded:
            return errc::cap_exceeded;
        case outcome_class::idempotency_conflict:
            return errc::idempotency_conflict;
        case outcome_class::retry_same_key:
            return errc::retry_same_key;
        case outcome_class::indeterminate:
            return errc::indeterminate;
        case outcome_class::rejected:
            return errc::rejected;
        case outcome_class::setup_error:
            return errc::setup_error;
    }
    return errc::indeterminate;
}

}  // namespace

result<refund> parse_refund(std::string_view body) {
    simdjson::dom::parser p;
    auto o = rf_parse_object(p, body);
    if (!o) return o.err();
    return rf_to_refund(*o);
}

result<refund_page> parse_refund_page(std::string_view body) {
    simdjson::dom::parser p;
    auto o = rf_parse_object(p, body);
    if (!o) return o.err();
    if (rf_str(*o, "object") != "list") return error(errc::bad_response, "not a list object");
    refund_page page;
    bool more = false;
    if (!(*o)["has_more"].get_bool().get(more)) page.has_more = more;
    simdjson::dom::array data;
    if ((*o)["data"].get_array().get(data)) return error(errc::bad_response, "list without data");
    for (element e : data) {
        object io;
        if (e.get_object().get(io)) return error(errc::bad_response, "list item is not an object");
        auto one = rf_to_refund(io);
        if (!one) return one.err();
        page.data.push_back(std::move(*one));
    }
    return page;
}

net::awaitable<refund_outcome> create_refund(client& c, refund_request req) {
    form_map f;
    f.emplace_back("charge", req.charge);
    f.emplace_back("amount", std::to_string(req.amount));
    if (!req.metadata.empty()) {
        form_map md;
        for (const auto& [k, v] : req.metadata) md.emplace_back(k, form_value(v));
        f.emplace_back("metadata", std::move(md));
    }
    auto r = co_await c.call("POST", "/v1/refunds", encode_form(f), std::move(req.idempotency_key),
                             std::move(req.stripe_account));
    refund_outcome out;
    out.cls = r.cls;
    out.http_status = r.http.ok() ? r.http.resp.status : 0;
    out.replayed = r.replayed;
    out.message = std::move(r.message);
    if (r.error) out.error = std::move(*r.error);
    if (out.cls == outcome_class::succeeded) {
        auto parsed = parse_refund(r.http.resp.body);
        if (!parsed) {
            // Done, but we cannot tell which refund: recovery's search finds it by its metadata.
            out.cls = outcome_class::indeterminate;
            out.message = "HTTP " + std::to_string(out.http_status) + " with unreadable body";
        } else {
            out.refund = std::move(*parsed);
        }
    }
    co_return out;
}

net::awaitable<result<std::optional<refund>>> find_refund_by_metadata(client& c, std::string charge,
                                                                      std::string name, std::string value,
                                                                      std::string stripe_account) {
    std::string after;
    for (;;) {
        std::string target = "/v1/refunds?limit=100&charge=" + http::url_encode(charge);
        if (!after.empty()) target += "&starting_after=" + http::url_encode(after);
        auto r = co_await c.call("GET", std::move(target), {}, {}, stripe_account);
        if (r.cls != outcome_class::succeeded) co_return error(rf_errc_for(r.cls), std::move(r.message));
        auto page = parse_refund_page(r.http.resp.body);
        if (!page) co_return page.err();
        for (auto& one : page->data)
            if (metadata_value(one.metadata, name) == value) co_return std::optional<refund>(std::move(one));
        if (!page->has_more || page->data.empty()) co_return std::optional<refund>();
        after = page->data.back().id;
    }
}

}  // namespace cg::stripe
