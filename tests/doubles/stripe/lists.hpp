// fake-stripe's private list machinery (lists.cpp): retrieve by id, a list's pages, the admin API's lists
// and Stripe's search language, as templates over the record kinds. Not part of the double's interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"
#include "http/proto/message.hpp"
#include "tests/doubles/stripe/params.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake::stripe_impl {

// GET /v1/<kind>/{id} (the id after `prefix` in `path`) in `account` ("" for the platform): the record as
// JSON, or Stripe's 404 naming `what` and the parameter `param_name` (another account's object included).
template <typename Rec, typename Json>
http::response by_id(const std::string& path, std::string_view prefix, const char* what,
                     const char* param_name, const std::string& account, const std::vector<Rec>& recs,
                     Json to_json) {
    auto id = path.substr(prefix.size());
    for (const auto& r : recs)
        if (r.id == id && r.account == account) return json_response(200, to_json(r));
    return error_response(404, "invalid_request_error", "resource_missing",
                          "No such " + std::string(what) + ": '" + id + "'", param_name);
}

// The admin API's {"data":[…],"count":N} of every record, each with the account it lives in ("" for the
// platform), which Stripe's objects do not carry.
template <typename Rec, typename Json>
http::response admin_list(const std::vector<Rec>& recs, Json to_json) {
    std::string data = "[";
    for (std::size_t i = 0; i < recs.size(); ++i) {
        std::string object = "{\"account\":";
        append_json_string(object, recs[i].account);
        data += (i ? "," : "") + object + "," + to_json(recs[i]).substr(1);
    }
    return json_response(
        200, json_obj().raw("data", data + "]").num("count", static_cast<std::int64_t>(recs.size())).done());
}

// A GET's query, decoded, or Stripe's refusal of it: a parameter the endpoint does not take (400
// parameter_unknown), `limit` outside 1..100 or not an integer, a `created` bound that is not an integer (400
// parameter_invalid_integer). `allowed` names the endpoint's parameters besides `expand`; `created` takes
// created[gt|gte|lt|lte] and `types` types[].
struct query {
    params p;
    std::vector<std::string> types;  // types[] (GET /v1/events), in order
    std::optional<http::response> bad;
};

query read_query(const http::request& req, std::initializer_list<std::string_view> allowed);

// The `created` filter of a list (exact, or any of gt, gte, lt, lte).
bool created_matches(const params& q, std::int64_t created);

// One page of a list endpoint, newest first: `limit` (default 10), starting_after or ending_before (an id
// of the list; 400 resource_missing otherwise), has_more. `all` holds the records that match, newest first.
template <typename Rec, typename Json>
http::response list_page(const params& q, std::string_view url, const std::vector<const Rec*>& all,
                         Json to_json) {
    const std::size_t limit = static_cast<std::size_t>(to_int(param(q, "limit")).value_or(10));
    auto after = param(q, "starting_after"), before = param(q, "ending_before");
    if (!after.empty() && !before.empty())
        return error_response(400, "invalid_request_error", "",
                              "You may only specify one of these parameters: ending_before, starting_after.");
    auto position = [&](const std::string& id) {
        return std::find_if(all.begin(), all.end(), [&](const Rec* r) { return r->id == id; });
    };
    std::size_t start = 0, end = 0;
    bool more = false;
    if (!before.empty()) {
        auto pos = position(before);
        if (pos == all.end())
            return error_response(400, "invalid_request_error", "resource_missing",
                                  "No such object: '" + before + "'", "ending_before");
        end = static_cast<std::size_t>(pos - all.begin());
        start = end > limit ? end - limit : 0;
        more = start > 0;
    } else {
        if (!after.empty()) {
            auto pos = position(after);
            if (pos == all.end())
                return error_response(400, "invalid_request_error", "resource_missing",
                                      "No such object: '" + after + "'", "starting_after");
            start = static_cast<std::size_t>(pos - all.begin()) + 1;
        }
        end = std::min(all.size(), start + limit);
        more = end < all.size();
    }
    std::string data = "[";
    for (std::size_t i = start; i < end; ++i) data += (i > start ? "," : "") + to_json(*all[i]);
    return json_response(200, json_obj()
                                  .str("object", "list")
                                  .raw("data", data + "]")
                                  .boolean("has_more", more)
                                  .str("url", url)
                                  .done());
}

// Stripe's search query language, the part chargeguard and the vault proxy's callers use: clauses joined
// by AND, each `field:'value'` (exact match) or `metadata['key']:'value'`. Anything else (OR, negation,
// comparisons, substring `~`) is refused with the clause named.
struct search_clause {
    std::string field, key, value;  // key: the metadata key when field == "metadata"
};

result<std::vector<search_clause>> parse_search(std::string_view q);

template <typename Rec>
bool metadata_has(const Rec& r, const std::string& k, const std::string& v) {
    return std::any_of(r.metadata.begin(), r.metadata.end(),
                       [&](const auto& kv) { return kv.first == k && kv.second == v; });
}

// GET /v1/<resource>/search: `query` (required), `limit` 1..100, `page` (the next_page of the previous
// answer); Stripe's search_result, newest first. `field_of(rec, name)` reads a searchable field; nullopt for
// a field the resource cannot be searched by.
template <typename Rec, typename Json, typename Field>
http::response search_page(const http::request& req, std::string_view resource, const std::vector<Rec>& recs,
                           const std::string& account, Json to_json, Field field_of) {
    auto q = read_query(req, {"query", "limit", "page"});
    if (q.bad) return std::move(*q.bad);
    if (!q.p.count("query"))
        return error_response(400, "invalid_request_error", "parameter_missing",
                              "Missing required param: query.", "query");
    auto clauses = parse_search(param(q.p, "query"));
    if (!clauses)
        return error_response(400, "invalid_request_error", "",
                              "Invalid search query: " + clauses.err().message, "query");
    for (const auto& c : *clauses)
        if (c.field != "metadata" && !field_of(recs.empty() ? Rec{} : recs.front(), c.field))
            return error_response(400, "invalid_request_error", "",
                                  "Field `" + c.field + "` is an unsupported search field for resource `" +
                                      std::string(resource) + "`.",
                                  "query");
    std::vector<const Rec*> all;
    for (auto it = recs.rbegin(); it != recs.rend(); ++it) {
        if (it->account != account) continue;
        bool ok = std::all_of(clauses->begin(), clauses->end(), [&](const search_clause& c) {
            return c.field == "metadata" ? metadata_has(*it, c.key, c.value)
                                         : field_of(*it, c.field) == c.value;
        });
        if (ok) all.push_back(&*it);
    }
    const std::size_t limit = static_cast<std::size_t>(to_int(param(q.p, "limit")).value_or(10));
    std::size_t start = 0;
    if (auto page = param(q.p, "page"); !page.empty()) {
        auto n = page.starts_with("page_") ? to_int(std::string_view(page).substr(5)) : std::nullopt;
        if (!n || *n < 0)
            return error_response(400, "invalid_request_error", "", "Invalid page: " + page, "page");
        start = std::min(all.size(), static_cast<std::size_t>(*n));
    }
    const std::size_t end = std::min(all.size(), start + limit);
    std::string data = "[";
    for (std::size_t i = start; i < end; ++i) data += (i > start ? "," : "") + to_json(*all[i]);
    std::string next = "null";
    if (end < all.size()) append_json_string(next = {}, "page_" + std::to_string(end));
    return json_response(200, json_obj()
                                  .str("object", "search_result")
                                  .raw("data", data + "]")
                                  .boolean("has_more", end < all.size())
                                  .raw("next_page", next)
                                  .str("url", "/v1/" + std::string(resource) + "/search")
                                  .done());
}

}  // namespace cg::fake::stripe_impl
