// fake-stripe's GET endpoints: retrieve by id, list pages, search and events (lists.hpp holds the templates
// they share), and Stripe's query checks.
#include "tests/doubles/stripe/lists.hpp"

#include <algorithm>
#include <cctype>
#include <limits>

#include "core/error.hpp"
#include "stripe/form.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

namespace cg::fake {
namespace stripe_impl {
namespace {

std::optional<std::string> parse_quoted(std::string_view& s) {
    if (s.empty() || (s.front() != '\'' && s.front() != '"')) return std::nullopt;
    const char quote = s.front();
    std::string out;
    for (std::size_t i = 1; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            out += s[++i];
        } else if (s[i] == quote) {
            s.remove_prefix(i + 1);
            return out;
        } else {
            out += s[i];
        }
    }
    return std::nullopt;
}

}  // namespace

query read_query(const http::request& req, std::initializer_list<std::string_view> allowed) {
    query q;
    auto decoded = stripe::decode_form(req.query());
    if (!decoded) {
        q.bad = error_response(400, "invalid_request_error", "", "Invalid query string");
        return q;
    }
    for (const auto& [k, v] : *decoded) {
        const std::string top = k.substr(0, k.find('['));
        bool known = top == "expand" || std::find(allowed.begin(), allowed.end(), top) != allowed.end();
        if (known && k != top) {
            const std::string sub = k.substr(top.size());
            known =
                top == "expand" || (top == "types" && sub == "[]") ||
                (top == "created" && (sub == "[gt]" || sub == "[gte]" || sub == "[lt]" || sub == "[lte]"));
        }
        if (!known) {
            q.bad = unknown_parameter(k);
            return q;
        }
        if (top == "created") q.bad = check_integer(k, v, 0, std::numeric_limits<std::int64_t>::max());
        if (k == "limit") q.bad = check_integer("limit", v, 1, 100);
        if (q.bad) return q;
        if (k == "types[]")
            q.types.push_back(v);
        else
            q.p[k] = v;
    }
    return q;
}

// The `created` filter of a list (exact, or any of gt, gte, lt, lte).
bool created_matches(const params& q, std::int64_t created) {
    auto bound = [&](const char* k) -> std::optional<std::int64_t> {
        auto it = q.find(k);
        if (it == q.end()) return std::nullopt;
        return to_int(it->second);
    };
    if (auto v = bound("created"); v && created != *v) return false;
    if (auto v = bound("created[gt]"); v && created <= *v) return false;
    if (auto v = bound("created[gte]"); v && created < *v) return false;
    if (auto v = bound("created[lt]"); v && created >= *v) return false;
    if (auto v = bound("created[lte]"); v && created > *v) return false;
    return true;
}

result<std::vector<search_clause>> parse_search(std::string_view q) {
    std::vector<search_clause> out;
    auto bad = [&](std::string why) {
        return result<std::vector<search_clause>>(core_errc::invalid_argument, why);
    };
    while (true) {
        while (!q.empty() && q.front() == ' ') q.remove_prefix(1);
        search_clause c;
        if (q.starts_with("metadata[")) {
            q.remove_prefix(9);
            auto key = parse_quoted(q);
            if (!key || !q.starts_with("]")) return bad("a metadata clause is metadata['key']:'value'");
            q.remove_prefix(1);
            c.field = "metadata";
            c.key = *key;
        } else {
            std::size_t n = 0;
            while (n < q.size() && (std::isalnum(static_cast<unsigned char>(q[n])) || q[n] == '_')) ++n;
            if (n == 0) return bad("expected a field name at '" + std::string(q) + "'");
            c.field = std::string(q.substr(0, n));
            q.remove_prefix(n);
        }
        if (!q.starts_with(":")) return bad("only exact matches (field:'value') are supported");
        q.remove_prefix(1);
        auto value = parse_quoted(q);
        if (!value) return bad("a value is quoted: field:'value'");
        c.value = *value;
        out.push_back(std::move(c));
        while (!q.empty() && q.front() == ' ') q.remove_prefix(1);
        if (q.empty()) return out;
        if (!q.starts_with("AND ")) return bad("clauses are joined by AND");
        q.remove_prefix(4);
    }
}

}  // namespace stripe_impl

using namespace stripe_impl;

http::response fake_stripe::get(const http::request& req) {
    std::string path(req.path());
    const std::string account = account_of(req);  // objects of another account are "No such …"
    const std::string version(req.headers.get("Stripe-Version").value_or(default_api_version_));
    auto intent_in = [&](const intent_rec& r) { return intent_json(r, version, charges_); };
    // Objects of the request's account that `match`, newest first.
    auto mine = [&](const auto& recs, auto match) {
        using rec = std::decay_t<decltype(recs.front())>;
        std::vector<const rec*> all;
        for (auto it = recs.rbegin(); it != recs.rend(); ++it)
            if (it->account == account && match(*it)) all.push_back(&*it);
        return all;
    };
    auto eq = [](const params& q, const char* k, const std::string& v) {
        auto it = q.find(k);
        return it == q.end() || it->second == v;
    };
    if (path == "/v1/charges") {
        auto q = read_query(req, {"customer", "created", "limit", "starting_after", "ending_before",
                                  "payment_intent", "transfer_group"});
        if (q.bad) return std::move(*q.bad);
        return list_page(q.p, path,
                         mine(charges_,
                              [&](const charge_rec& c) {
                                  return eq(q.p, "customer", c.customer) &&
                                         eq(q.p, "payment_intent", c.payment_intent) &&
                                         !q.p.count("transfer_group") && created_matches(q.p, c.created);
                              }),
                         charge_json);
    }
    if (path == "/v1/payment_intents") {
        auto q = read_query(req, {"customer", "created", "limit", "starting_after", "ending_before"});
        if (q.bad) return std::move(*q.bad);
        return list_page(q.p, path,
                         mine(intents_,
                              [&](const intent_rec& r) {
                                  return eq(q.p, "customer", r.customer) && created_matches(q.p, r.created);
                              }),
                         intent_in);
    }
    // Refunds and disputes list alike: by the payment they belong to (charge, payment_intent) and created.
    auto by_payment = [&](const auto& recs, auto to_json) -> http::response {
        using rec = std::decay_t<decltype(recs.front())>;
        auto q = read_query(
            req, {"charge", "payment_intent", "created", "limit", "starting_after", "ending_before"});
        if (q.bad) return std::move(*q.bad);
        return list_page(q.p, path,
                         mine(recs,
                              [&](const rec& r) {
                                  return eq(q.p, "charge", r.charge) &&
                                         eq(q.p, "payment_intent", r.payment_intent) &&
                                         created_matches(q.p, r.created);
                              }),
                         to_json);
    };
    if (path == "/v1/refunds") return by_payment(refunds_, refund_json);
    if (path == "/v1/disputes") return by_payment(disputes_, dispute_json);
    if (path == "/v1/events") {
        auto q = read_query(req, {"type", "types", "created", "delivery_success", "limit", "starting_after",
                                  "ending_before"});
        if (q.bad) return std::move(*q.bad);
        if (q.p.count("type") && !q.types.empty())
            return error_response(400, "invalid_request_error", "",
                                  "You may only specify one of these parameters: type, types.");
        return list_page(q.p, path,
                         mine(events_,
                              [&](const event_rec& e) {
                                  bool typed = q.types.empty() || std::find(q.types.begin(), q.types.end(),
                                                                            e.type) != q.types.end();
                                  return typed && eq(q.p, "type", e.type) && created_matches(q.p, e.created);
                              }),
                         [](const event_rec& e) { return e.body; });
    }
    if (path == "/v1/charges/search")
        return search_page(req, "charges", charges_, account, charge_json,
                           [](const charge_rec& c, const std::string& f) -> std::optional<std::string> {
                               if (f == "customer") return c.customer;
                               if (f == "status") return c.status;
                               if (f == "payment_intent") return c.payment_intent;
                               if (f == "currency") return c.currency;
                               return std::nullopt;
                           });
    if (path == "/v1/payment_intents/search")
        return search_page(req, "payment_intents", intents_, account, intent_in,
                           [](const intent_rec& r, const std::string& f) -> std::optional<std::string> {
                               if (f == "customer") return r.customer;
                               if (f == "status") return r.status;
                               if (f == "currency") return r.currency;
                               return std::nullopt;
                           });
    // One object: only `expand` besides the id.
    if (auto q = read_query(req, {}); q.bad) return std::move(*q.bad);
    if (path.starts_with("/v1/charges/"))
        return by_id(path, "/v1/charges/", "charge", "id", account, charges_, charge_json);
    if (path.starts_with("/v1/events/"))
        return by_id(path, "/v1/events/", "event", "id", account, events_,
                     [](const event_rec& e) { return e.body; });
    if (path.starts_with("/v1/refunds/"))
        return by_id(path, "/v1/refunds/", "refund", "id", account, refunds_, refund_json);
    if (path.starts_with("/v1/disputes/"))
        return by_id(path, "/v1/disputes/", "dispute", "id", account, disputes_, dispute_json);
    if (path.starts_with("/v1/payment_intents/"))
        return by_id(path, "/v1/payment_intents/", "payment_intent", "intent", account, intents_, intent_in);
    return error_response(404, "invalid_request_error", "", "Unrecognized request URL (GET: " + path + ")");
}

}  // namespace cg::fake
