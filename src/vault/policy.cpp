#include "vault/policy.hpp"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <set>

#include "http/proto/message.hpp"
#include "stripe/form.hpp"

namespace cg::vault {
namespace {

bool is_object_id(std::string_view s) {
    return !s.empty() && s.size() <= 255 && s.find('/') == std::string_view::npos;
}

// `code` is one of Stripe's error codes for the pinned API version, or empty where Stripe has none for the
// case (its error object's code is optional): tests/conformance/stripe holds the vault to that list.
refusal bad(std::string code, std::string message, std::string param = {}) {
    return refusal{400, "invalid_request_error", std::move(code), std::move(message), std::move(param)};
}

// A parameter name as Stripe's Rack-style parser (normalize_params) splits it: leading '[' and ']' are
// skipped, the base runs to the next '[' or ']', the ']'s after it are skipped, and the rest nests below the
// base ("metadata[k]" → metadata, "[k]"; "amount]" → amount, ""; "[amount" → amount, "").
struct rack_name {
    std::string_view base;
    std::string_view after;
};
rack_name split_rack_name(std::string_view name) {
    std::size_t i = 0;
    while (i < name.size() && (name[i] == '[' || name[i] == ']')) ++i;
    std::size_t j = i;
    while (j < name.size() && name[j] != '[' && name[j] != ']') ++j;
    std::size_t k = j;
    while (k < name.size() && name[k] == ']') ++k;
    return {name.substr(i, j - i), name.substr(k)};
}

// The metadata key a parameter name sets as Rack reads it ("metadata[k]", "metadata[k]]", "[metadata][[k]"
// → k), or empty when the name does not nest under metadata.
std::string_view metadata_key_of(std::string_view name) {
    auto top = split_rack_name(name);
    if (top.base != "metadata" || top.after.empty()) return {};
    return split_rack_name(top.after).base;
}

bool iequals_ascii(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

}  // namespace

std::string_view cancelled_intent(std::string_view path) {
    constexpr std::string_view prefix = "/v1/payment_intents/", suffix = "/cancel";
    if (!path.starts_with(prefix) || !path.ends_with(suffix)) return {};
    auto id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    if (!id.starts_with("pi_") || !is_object_id(id)) return {};
    return id;
}

operation operation_for(std::string_view method, std::string_view path) {
    auto under = [&](std::string_view collection) -> int {
        // 0: the collection itself; 1: one object or /search; -1: neither
        if (path == collection) return 0;
        if (path.starts_with(collection) && path.size() > collection.size() &&
            path[collection.size()] == '/' && is_object_id(path.substr(collection.size() + 1)))
            return 1;
        return -1;
    };
    int c = under("/v1/charges"), p = under("/v1/payment_intents"), r = under("/v1/refunds");
    if (method == "POST") {
        if (c == 0) return {std::string(op_charges_create), true};
        if (p == 0) return {std::string(op_intents_create), true};
        if (r == 0) return {std::string(op_refunds_create), false, true};
        if (!cancelled_intent(path).empty()) return {std::string(op_intents_create), false, false, true};
        return {};
    }
    if (method == "GET") {
        if (c >= 0) return {std::string(op_charges_read), false};
        if (p >= 0) return {std::string(op_intents_read), false};
        if (r >= 0) return {std::string(op_refunds_read), false};
    }
    return {};
}

result<std::vector<std::string>> parse_allow_list(std::string_view csv) {
    static constexpr std::array<std::string_view, 6> known{op_charges_create, op_intents_create,
                                                           op_charges_read,   op_intents_read,
                                                           op_refunds_create, op_refunds_read};
    std::vector<std::string> out;
    while (!csv.empty()) {
        auto comma = csv.find(',');
        auto item = csv.substr(0, comma);
        csv = comma == std::string_view::npos ? std::string_view() : csv.substr(comma + 1);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        if (item.empty()) continue;
        if (std::find(known.begin(), known.end(), item) == known.end())
            return error(core_errc::invalid_argument, "unknown operation '" + std::string(item) +
                                                          "' (known: " + std::string(default_allow) + "," +
                                                          std::string(op_refunds_create) + "," +
                                                          std::string(op_refunds_read) + ")");
        if (std::find(out.begin(), out.end(), item) == out.end()) out.emplace_back(item);
    }
    if (out.empty()) return error(core_errc::invalid_argument, "the allow list is empty");
    return out;
}

std::optional<refusal> check_create_envelope(std::string_view query,
                                             std::optional<std::string_view> content_type) {
    if (!query.empty())
        return bad("parameter_unknown",
                   "The vault takes a create's parameters only in its form body; this request has a query "
                   "string. Send every parameter in the body.");
    if (content_type) {
        auto media = trim(content_type->substr(0, content_type->find(';')));
        if (!iequals_ascii(media, "application/x-www-form-urlencoded"))
            return bad("",
                       "The vault takes create bodies only as application/x-www-form-urlencoded, not " +
                           std::string(trim(*content_type).substr(0, 80)) + ".",
                       "Content-Type");
    }
    return std::nullopt;
}

std::variant<create_params, refusal> parse_create(std::string_view body, std::string_view key_currency) {
    auto pairs = stripe::decode_form(body);
    if (!pairs) return bad("", "Invalid request body: not application/x-www-form-urlencoded");
    create_params p;
    bool have_amount = false, have_currency = false, have_customer = false;
    std::set<std::string_view> metadata;
    for (const auto& [k, v] : *pairs) {
        auto base = split_rack_name(k).base;
        if ((base == "amount" || base == "currency" || base == "customer") && k != base)
            return bad("",
                       "Invalid parameter name " + k.substr(0, 80) + ": Stripe would read it as " +
                           std::string(base) + "; send " + std::string(base) + " under its exact name.",
                       std::string(base));
        if (auto mk = metadata_key_of(k); !mk.empty()) {
            if (mk == vault_tag_key)
                return bad("",
                           "metadata[" + std::string(vault_tag_key) +
                               "] is reserved: the vault sets it on every create to find the request on "
                               "Stripe later.",
                           "metadata[" + std::string(vault_tag_key) + "]");
            metadata.insert(mk);
            continue;
        }
        if (k == "amount") {
            if (have_amount) return bad("", "amount is given more than once", "amount");
            have_amount = true;
            if (v.empty() || v.size() > 12 ||
                !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
                return bad("parameter_invalid_integer", "Invalid integer: " + v.substr(0, 40), "amount");
            p.amount = std::stoll(v);
            if (p.amount <= 0)
                return bad("parameter_invalid_integer", "amount must be a positive integer", "amount");
        } else if (k == "currency") {
            if (have_currency) return bad("", "currency is given more than once", "currency");
            have_currency = true;
            if (v.size() != 3 || !std::all_of(v.begin(), v.end(), [](char ch) {
                    return std::isalpha(static_cast<unsigned char>(ch));
                }))
                return bad("", "Invalid currency: " + v.substr(0, 40), "currency");
            for (char ch : v) p.currency += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        } else if (k == "customer") {
            if (have_customer) return bad("", "customer is given more than once", "customer");
            have_customer = true;
            p.customer = v;
        }
    }
    p.metadata_keys = static_cast<int>(metadata.size());
    if (p.metadata_keys >= stripe_max_metadata_keys)
        return bad("",
                   "This request has " + std::to_string(p.metadata_keys) + " metadata keys; Stripe allows " +
                       std::to_string(stripe_max_metadata_keys) + " and the vault adds metadata[" +
                       std::string(vault_tag_key) + "] to every create, so at most " +
                       std::to_string(stripe_max_metadata_keys - 1) + " can be sent through the vault.",
                   "metadata");
    if (!have_amount) return bad("parameter_missing", "Missing required param: amount.", "amount");
    if (!have_currency) return bad("parameter_missing", "Missing required param: currency.", "currency");
    if (p.currency != key_currency)
        return bad("currency_mismatch",
                   "This vault key spends " + std::string(key_currency) + ", not " + p.currency + ".",
                   "currency");
    return p;
}

std::string with_vault_tag(std::string_view body, std::string_view idempotency_key) {
    auto tag = "metadata[" + std::string(vault_tag_key) + "]=" + http::url_encode(idempotency_key);
    // Sized once: this copy of the body is held for the whole upstream call, and growing it by appending
    // would double its capacity.
    std::string out;
    out.reserve(body.size() + 1 + tag.size());
    out.append(body);
    if (!out.empty()) out += '&';
    out += tag;
    return out;
}

bool carries_vault_tag(std::string_view body, std::string_view idempotency_key) {
    auto pairs = stripe::decode_form(body);
    if (!pairs) return false;
    const std::string* tag = nullptr;
    for (const auto& [k, v] : *pairs)
        if (metadata_key_of(k) == vault_tag_key) tag = &v;
    return tag && *tag == idempotency_key;
}

settlement owner_settlement(int status, bool request_sent) {
    if (status == 0) return request_sent ? settlement::uncertain : settlement::release;
    if (status >= 200 && status < 300) return settlement::settle;
    // 409 idempotency_key_in_use: a request with this key is executing at Stripe right now (a retry that got
    // there first); it may charge. 424 (external dependency failed) is Stripe's "may have executed".
    if (status == 409 || status == 424) return settlement::uncertain;
    // Any other 4xx: this request did not execute (validation, decline, 401/403, 429 before idempotency).
    if (status >= 400 && status < 500) return settlement::release;
    return settlement::uncertain;
}

replay_action replay_settlement(const replay_answer& a) {
    int s = a.status;
    if (s >= 200 && s < 300) return replay_action::settle;
    bool client_error = s >= 400 && s < 500 && s != 424;
    if (client_error) {
        // Before idempotency (401, 403, 429), or another request with the key is executing (409), or Stripe
        // says to try again: nothing about an earlier request with this key.
        if (s == 401 || s == 403 || s == 409 || s == 429 || a.should_retry == true)
            return replay_action::defer;
        // The key was used with other parameters: that request may have executed and charged.
        if (s == 400 && a.error_type == "idempotency_error") return replay_action::search;
        return replay_action::release;
    }
    // A replayed 424/5xx is Stripe's saved answer: replaying again will say the same. Only a search can tell.
    if (s >= 400 && a.replayed) return replay_action::search;
    return replay_action::defer;  // no answer, a 3xx, or a 424/5xx not saved: try again later
}

bool replay_in_window(std::chrono::seconds age_at_read, std::chrono::steady_clock::duration since_read,
                      std::chrono::seconds window) {
    auto age = age_at_read + std::chrono::ceil<std::chrono::seconds>(
                                 std::max(since_read, std::chrono::steady_clock::duration::zero()));
    return age < window;
}

std::optional<std::string> same_key_window_problem(std::chrono::seconds window) {
    if (window < std::chrono::minutes(1) || window > max_same_key_window)
        return "must be between 1m and 23h: Stripe may forget an Idempotency-Key once it is 24 h old, and a "
               "retry or the resolver's replay under that key must reach Stripe before then (above 23 h a "
               "replay could execute the request a second time)";
    return std::nullopt;
}

std::string json_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 2);
    for (char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    return out;
}

std::string error_body(const refusal& r) {
    std::string out = "{\n  \"error\": {\n";
    if (!r.code.empty()) out += "    \"code\": \"" + json_escape(r.code) + "\",\n";
    out += "    \"message\": \"" + json_escape(r.message) + "\",\n";
    if (!r.param.empty()) out += "    \"param\": \"" + json_escape(r.param) + "\",\n";
    out += "    \"type\": \"" + json_escape(r.type) + "\"\n  }\n}\n";
    return out;
}

std::optional<std::string> object_id(std::string_view json_body) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(json_body.data(), json_body.size()).get(doc) != simdjson::SUCCESS) return std::nullopt;
    std::string_view id;
    if (doc["id"].get(id) != simdjson::SUCCESS || id.empty()) return std::nullopt;
    return std::string(id);
}

}  // namespace cg::vault
