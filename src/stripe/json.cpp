#include "stripe/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstddef>

#include "stripe/error.hpp"

namespace cg::stripe {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

simdjson::dom::parser& parser() {
    thread_local simdjson::dom::parser p;
    return p;
}

// A parser grows to the largest document it parsed (its tape and string buffers, several times the body) and
// keeps that: one list page (100 objects) would hold its memory on every thread that read one for good. A
// body far smaller than the parser's capacity gives it back first; single objects, most of what is parsed,
// fit in the floor.
constexpr std::size_t parser_floor = 64 * 1024;

void fit_parser(simdjson::dom::parser& p, std::size_t body) {
    if (p.capacity() <= parser_floor || body * 4 >= p.capacity()) return;
    if (p.allocate(std::max(body, parser_floor)) != simdjson::SUCCESS) return;  // the parse allocates itself
}

// The top-level object of `body`, valid until the next parse with `p` (this thread's parser by default).
result<object> parse_object(std::string_view body, simdjson::dom::parser& p = parser()) {
    element doc;
    fit_parser(p, body.size());
    if (auto e = p.parse(body.data(), body.size()).get(doc); e)
        return error(errc::bad_response, std::string("JSON: ") + simdjson::error_message(e));
    object o;
    if (doc.get_object().get(o)) return error(errc::bad_response, "JSON body is not an object");
    return o;
}

std::string str(object o, std::string_view key) {
    std::string_view s;
    if (o[key].get_string().get(s)) return {};
    return std::string(s);
}

std::int64_t num(object o, std::string_view key) {
    std::int64_t n = 0;
    if (o[key].get_int64().get(n)) return 0;
    return n;
}

// An expandable field: a string id, or an object with an id.
std::string id_or_object(object o, std::string_view key) {
    element e;
    if (o[key].get(e)) return {};
    std::string_view s;
    if (!e.get_string().get(s)) return std::string(s);
    object inner;
    if (!e.get_object().get(inner)) return str(inner, "id");
    return {};
}

metadata meta(object o) {
    metadata out;
    object m;
    if (o["metadata"].get_object().get(m)) return out;
    for (auto field : m) {
        std::string_view v;
        if (!field.value.get_string().get(v)) out.emplace_back(std::string(field.key), std::string(v));
    }
    return out;
}

result<charge> to_charge(object o) {
    charge c;
    c.id = str(o, "id");
    if (c.id.empty() || str(o, "object") != "charge") return error(errc::bad_response, "not a charge object");
    c.amount = num(o, "amount");
    c.currency = str(o, "currency");
    c.customer = id_or_object(o, "customer");
    c.status = str(o, "status");
    bool paid = false;
    if (!o["paid"].get_bool().get(paid)) c.paid = paid;
    c.created = num(o, "created");
    c.payment_intent = id_or_object(o, "payment_intent");
    c.payment_method = id_or_object(o, "payment_method");
    c.description = str(o, "description");
    c.failure_code = str(o, "failure_code");
    object details;
    if (!o["payment_method_details"].get_object().get(details)) c.payment_method_type = str(details, "type");
    c.metadata = meta(o);
    return c;
}

result<payment_intent> to_intent(object o) {
    payment_intent p;
    p.id = str(o, "id");
    if (p.id.empty() || str(o, "object") != "payment_intent")
        return error(errc::bad_response, "not a payment_intent object");
    p.amount = num(o, "amount");
    p.currency = str(o, "currency");
    p.customer = id_or_object(o, "customer");
    p.status = str(o, "status");
    p.latest_charge = id_or_object(o, "latest_charge");
    p.created = num(o, "created");
    object last;
    if (!o["last_payment_error"].get_object().get(last)) {
        p.last_error_code = str(last, "code");
        object pm;
        if (!last["payment_method"].get_object().get(pm)) p.payment_method_type = str(pm, "type");
    }
    p.metadata = meta(o);
    return p;
}

result<refund> to_refund(object o) {
    refund r;
    r.id = str(o, "id");
    if (r.id.empty() || str(o, "object") != "refund") return error(errc::bad_response, "not a refund object");
    r.amount = num(o, "amount");
    r.created = num(o, "created");
    r.charge = id_or_object(o, "charge");
    r.payment_intent = id_or_object(o, "payment_intent");
    r.currency = str(o, "currency");
    r.status = str(o, "status");
    r.metadata = meta(o);
    return r;
}

// A list object ({"object":"list","data":[…],"has_more":…}) of items read by `item`.
template <typename Page, typename Item>
result<Page> parse_page(std::string_view body, Item item) {
    // A parser of its own, freed on return: a page of up to 100 objects makes a parser several times the
    // body, which this thread's parser would keep until a small body on the same thread shrank it.
    simdjson::dom::parser page_parser;
    auto o = parse_object(body, page_parser);
    if (!o) return o.err();
    if (str(*o, "object") != "list") return error(errc::bad_response, "not a list object");
    Page page;
    bool more = false;
    if (!(*o)["has_more"].get_bool().get(more)) page.has_more = more;
    simdjson::dom::array data;
    if ((*o)["data"].get_array().get(data)) return error(errc::bad_response, "list without data");
    for (element e : data) {
        object io;
        if (e.get_object().get(io)) return error(errc::bad_response, "list item is not an object");
        auto one = item(io);
        if (!one) return one.err();
        page.data.push_back(std::move(*one));
    }
    return page;
}

}  // namespace

std::optional<std::string_view> metadata_value(const metadata& m, std::string_view key) {
    for (const auto& [k, v] : m)
        if (k == key) return std::string_view(v);
    return std::nullopt;
}

result<charge> parse_charge(std::string_view body) {
    auto o = parse_object(body);
    if (!o) return o.err();
    return to_charge(*o);
}

result<payment_intent> parse_payment_intent(std::string_view body) {
    auto o = parse_object(body);
    if (!o) return o.err();
    return to_intent(*o);
}

result<charge_page> parse_charge_page(std::string_view body) {
    return parse_page<charge_page>(body, to_charge);
}

result<payment_intent_page> parse_payment_intent_page(std::string_view body) {
    return parse_page<payment_intent_page>(body, to_intent);
}

result<refund> parse_refund(std::string_view body) {
    auto o = parse_object(body);
    if (!o) return o.err();
    return to_refund(*o);
}

result<refund_page> parse_refund_page(std::string_view body) {
    return parse_page<refund_page>(body, to_refund);
}

std::optional<api_error> parse_error(std::string_view body) {
    auto o = parse_object(body);
    if (!o) return std::nullopt;
    object e;
    if ((*o)["error"].get_object().get(e)) return std::nullopt;
    api_error out;
    out.type = str(e, "type");
    out.code = str(e, "code");
    out.decline_code = str(e, "decline_code");
    out.message = str(e, "message");
    out.param = str(e, "param");
    out.charge = id_or_object(e, "charge");
    out.payment_intent = id_or_object(e, "payment_intent");
    return out;
}

}  // namespace cg::stripe
