#include "vault/policy.hpp"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>

#include "http/proto/message.hpp"
#include "stripe/form.hpp"

namespace cg::vault {
namespace {

bool is_object_id(std::string_view s) {
    return !s.empty() && s.size() <= 255 && s.find('/') == std::string_view::npos;
}

refusal bad(std::string code, std::string message, std::string param = {}) {
    return refusal{400, "invalid_request_error", std::move(code), std::move(message), std::move(param)};
}

}  // namespace

operation operation_for(std::string_view method, std::string_view path) {
    auto under = [&](std::string_view collection) -> int {
        // 0: the collection itself; 1: one object or /search; -1: neither
        if (path == collection) return 0;
        if (path.starts_with(collection) && path.size() > collection.size() &&
            path[collection.size()] == '/' && is_object_id(path.substr(collection.size() + 1)))
            return 1;
        return -1;
    };
    int c = under("/v1/charges"), p = under("/v1/payment_intents");
    if (method == "POST") {
        if (c == 0) return {std::string(op_charges_create), true};
        if (p == 0) return {std::string(op_intents_create), true};
        return {};
    }
    if (method == "GET") {
        if (c >= 0) return {std::string(op_charges_read), false};
        if (p >= 0) return {std::string(op_intents_read), false};
    }
    return {};
}

result<std::vector<std::string>> parse_allow_list(std::string_view csv) {
    static constexpr std::array<std::string_view, 4> known{op_charges_create, op_intents_create,
                                                           op_charges_read, op_intents_read};
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
                                                          "' (known: " + std::string(default_allow) + ")");
        if (std::find(out.begin(), out.end(), item) == out.end()) out.emplace_back(item);
    }
    if (out.empty()) return error(core_errc::invalid_argument, "the allow list is empty");
    return out;
}

std::variant<create_params, refusal> parse_create(std::string_view body, std::string_view key_currency) {
    auto pairs = stripe::decode_form(body);
    if (!pairs)
        return bad("parameter_invalid", "Invalid request body: not application/x-www-form-urlencoded");
    create_params p;
    bool have_amount = false, have_currency = false, have_customer = false;
    for (const auto& [k, v] : *pairs) {
        if (k == "amount") {
            if (have_amount) return bad("parameter_invalid", "amount is given more than once", "amount");
            have_amount = true;
            if (v.empty() || v.size() > 12 ||
                !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
                return bad("parameter_invalid_integer", "Invalid integer: " + v.substr(0, 40), "amount");
            p.amount = std::stoll(v);
            if (p.amount <= 0)
                return bad("parameter_invalid_integer", "amount must be a positive integer", "amount");
        } else if (k == "currency") {
            if (have_currency)
                return bad("parameter_invalid", "currency is given more than once", "currency");
            have_currency = true;
            if (v.size() != 3 || !std::all_of(v.begin(), v.end(), [](char ch) {
                    return std::isalpha(static_cast<unsigned char>(ch));
                }))
                return bad("parameter_invalid", "Invalid currency: " + v.substr(0, 40), "currency");
            for (char ch : v) p.currency += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        } else if (k == "customer") {
            if (have_customer)
                return bad("parameter_invalid", "customer is given more than once", "customer");
            have_customer = true;
            p.customer = v;
        } else if (k.starts_with("metadata[")) {
            ++p.metadata_keys;
        }
    }
    if (!have_amount) return bad("parameter_missing", "Missing required param: amount.", "amount");
    if (!have_currency) return bad("parameter_missing", "Missing required param: currency.", "currency");
    if (p.currency != key_currency)
        return bad("currency_mismatch",
                   "This vault key spends " + std::string(key_currency) + ", not " + p.currency + ".",
                   "currency");
    return p;
}

std::string with_vault_tag(std::string_view body, std::string_view idempotency_key, const create_params& p) {
    std::string tag = "metadata[" + std::string(vault_tag_key) + "]";
    std::string encoded_tag = "metadata%5B" + std::string(vault_tag_key) + "%5D";
    if (p.metadata_keys >= 50 || body.find(tag) != std::string_view::npos ||
        body.find(encoded_tag) != std::string_view::npos)
        return std::string(body);
    std::string out(body);
    if (!out.empty()) out += '&';
    out += tag + "=" + http::url_encode(idempotency_key);
    return out;
}

settlement settlement_for(int status, bool request_sent) {
    if (status == 0) return request_sent ? settlement::uncertain : settlement::release;
    if (status >= 200 && status < 300) return settlement::settle;
    // 4xx: Stripe answered and did not execute (validation, decline, 409 in use, 429) — nothing moved.
    // 424 (external dependency failed) is Stripe's "may have executed", like a 5xx.
    if (status >= 400 && status < 500 && status != 424) return settlement::release;
    return settlement::uncertain;
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
