// What fake-stripe reads of a request (form parameters, the Stripe-Account header) and Stripe's checks of a
// creating POST's parameters (params.hpp).
#include "tests/doubles/stripe/params.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "http/proto/message.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake::stripe_impl {

std::optional<std::int64_t> to_int(std::string_view s) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
    return v;
}

std::vector<std::pair<std::string, std::string>> metadata_of(const params& p) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [k, v] : p)
        if (k.starts_with("metadata[") && k.ends_with("]")) out.emplace_back(k.substr(9, k.size() - 10), v);
    return out;
}

std::string param(const params& p, const std::string& k) {
    auto it = p.find(k);
    return it == p.end() ? std::string() : it->second;
}

// The account a request acts in: its Stripe-Account header (checked by api()); empty: the platform.
std::string account_of(const http::request& req) {
    return std::string(req.headers.get("Stripe-Account").value_or(""));
}

bool well_formed_account(std::string_view a) {
    return a.starts_with("acct_") && a.size() > 5 && std::all_of(a.begin() + 5, a.end(), [](char c) {
               return std::isalnum(static_cast<unsigned char>(c));
           });
}

// Stripe's published error codes for a parameter it refuses: `parameter_unknown`, `parameter_missing`,
// `parameter_invalid_empty` (an empty string: Stripe takes it for an attempt to unset the parameter),
// `parameter_invalid_integer`, `amount_too_large`. A value outside an enum or a malformed currency has no
// code, as at Stripe: only the type, the message and the param.
http::response unknown_parameter(const std::string& k) {
    return error_response(400, "invalid_request_error", "parameter_unknown",
                          "Received unknown parameter: " + k, k);
}

namespace {

std::optional<http::response> only_known(const params& p, const std::vector<std::string>& allowed) {
    for (const auto& [k, v] : p) {
        auto top = k.substr(0, k.find('['));
        if (std::find(allowed.begin(), allowed.end(), top) == allowed.end()) return unknown_parameter(k);
    }
    return std::nullopt;
}

std::optional<http::response> no_empty_strings(const params& p) {
    for (const auto& [k, v] : p)
        if (v.empty() && !k.starts_with("metadata["))
            return error_response(
                400, "invalid_request_error", "parameter_invalid_empty",
                "You passed an empty string for '" + k +
                    "'. We assume empty values are an attempt to unset a parameter; however '" + k +
                    "' cannot be unset. You should remove '" + k +
                    "' from your request or supply a non-empty value.",
                k);
    return std::nullopt;
}

}  // namespace

// An integer parameter within [lo, hi] (Stripe's messages for a value that is not one, or out of range).
std::optional<http::response> check_integer(std::string_view name, std::string_view value, std::int64_t lo,
                                            std::int64_t hi) {
    auto n = to_int(value);
    if (!n)
        return error_response(400, "invalid_request_error", "parameter_invalid_integer",
                              "Invalid integer: " + std::string(value), name);
    if (*n < lo)
        return error_response(400, "invalid_request_error", "parameter_invalid_integer",
                              "This value must be greater than or equal to " + std::to_string(lo) + ".",
                              name);
    if (*n > hi)
        return error_response(400, "invalid_request_error", "parameter_invalid_integer",
                              "This value must be less than or equal to " + std::to_string(hi) + ".", name);
    return std::nullopt;
}

namespace {

// Stripe's parameter checks shared by both creating endpoints; nullopt when valid.
std::optional<http::response> validate_common(const params& p, const std::vector<std::string>& allowed) {
    if (auto bad = only_known(p, allowed)) return bad;
    if (auto bad = no_empty_strings(p)) return bad;
    if (!p.count("amount"))
        return error_response(400, "invalid_request_error", "parameter_missing",
                              "Missing required param: amount.", "amount");
    if (auto bad = check_integer("amount", param(p, "amount"), 1, std::numeric_limits<std::int64_t>::max()))
        return bad;
    if (*to_int(param(p, "amount")) > 99999999)
        return error_response(400, "invalid_request_error", "amount_too_large",
                              "Amount must be no more than 99999999 in the currency's smallest unit.",
                              "amount");
    if (!p.count("currency"))
        return error_response(400, "invalid_request_error", "parameter_missing",
                              "Missing required param: currency.", "currency");
    auto cur = param(p, "currency");
    if (cur.size() != 3 || !std::all_of(cur.begin(), cur.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        return error_response(400, "invalid_request_error", "", "Invalid currency: " + cur, "currency");
    if (!param(p, "customer").starts_with("cus_"))
        return error_response(400, "invalid_request_error", "resource_missing",
                              "No such customer: '" + param(p, "customer") + "'", "customer");
    auto meta = metadata_of(p);
    if (meta.size() > 50)
        return error_response(400, "invalid_request_error", "",
                              "You can only specify up to 50 metadata keys.", "metadata");
    for (const auto& [k, v] : meta) {
        if (k.empty() || k.size() > 40 || k.find_first_of("[]") != std::string::npos)
            return error_response(400, "invalid_request_error", "",
                                  "Metadata keys can have up to 40 characters and no square brackets: " + k,
                                  "metadata");
        if (v.size() > 500)
            return error_response(400, "invalid_request_error", "",
                                  "Metadata values can have up to 500 characters", "metadata[" + k + "]");
    }
    return std::nullopt;
}

}  // namespace

// "/v1/payment_intents/pi_…/cancel" → "pi_…"; empty for any other path.
std::string cancelled_intent_id(const std::string& path) {
    constexpr std::string_view prefix = "/v1/payment_intents/", suffix = "/cancel";
    if (!path.starts_with(prefix) || !path.ends_with(suffix) || path.size() <= prefix.size() + suffix.size())
        return {};
    auto id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    return id.find('/') == std::string::npos ? id : std::string();
}

intent_methods methods_of(const params& p, std::string_view version) {
    intent_methods m;
    for (const auto& [k, v] : p)
        if (k.starts_with("payment_method_types[")) m.types.push_back(v);
    auto enabled = p.find("automatic_payment_methods[enabled]");
    if (enabled != p.end())
        m.automatic = enabled->second == "true";
    else
        m.automatic = m.types.empty() && version >= "2023-08-16";
    if (m.automatic) {
        m.redirects = param(p, "automatic_payment_methods[allow_redirects]") != "never";
        m.types.clear();
    } else if (m.types.empty()) {
        m.types.push_back("card");
    }
    return m;
}

namespace {

std::optional<http::response> validate_intent(const params& p, std::string_view version) {
    auto bad = validate_common(
        p, {"amount", "currency", "customer", "description", "metadata", "expand", "payment_method",
            "confirm", "off_session", "payment_method_types", "automatic_payment_methods", "return_url"});
    if (bad) return bad;
    const bool confirm = param(p, "confirm") == "true";
    if (p.count("off_session") && !confirm)
        return error_response(400, "invalid_request_error", "",
                              "off_session can only be used when confirm=true", "off_session");
    if (confirm && param(p, "payment_method").empty())
        return error_response(400, "invalid_request_error", "parameter_missing",
                              "A payment method is required to confirm this PaymentIntent", "payment_method");
    const bool has_types = std::any_of(
        p.begin(), p.end(), [](const auto& kv) { return kv.first.starts_with("payment_method_types["); });
    if (has_types && param(p, "automatic_payment_methods[enabled]") == "true")
        return error_response(400, "invalid_request_error", "",
                              "You may only specify one of these parameters: automatic_payment_methods, "
                              "payment_method_types.");
    auto redirects = p.find("automatic_payment_methods[allow_redirects]");
    if (redirects != p.end() && redirects->second != "always" && redirects->second != "never")
        return error_response(
            400, "invalid_request_error", "",
            "Invalid automatic_payment_methods[allow_redirects]: must be one of always or never",
            "automatic_payment_methods[allow_redirects]");
    if (p.count("return_url") && !confirm)
        return error_response(
            400, "invalid_request_error", "",
            "The parameter `return_url` cannot be passed when creating a PaymentIntent unless "
            "`confirm` is set to true.",
            "return_url");
    const auto methods = methods_of(p, version);
    const std::string pm_type = async_method_of(param(p, "payment_method")) ? "us_bank_account" : "card";
    if (!methods.automatic && !param(p, "payment_method").empty() &&
        std::find(methods.types.begin(), methods.types.end(), pm_type) == methods.types.end()) {
        std::string allowed;
        for (const auto& t : methods.types) allowed += (allowed.empty() ? "" : ", ") + t;
        return error_response(
            400, "invalid_request_error", "payment_intent_incompatible_payment_method",
            "The PaymentMethod provided (" + pm_type +
                ") is not allowed for this PaymentIntent. Please attach a PaymentMethod of one "
                "of the following types: " +
                allowed + ".",
            "payment_method");
    }
    if (confirm && param(p, "return_url").empty() && methods.redirects)
        return error_response(
            400, "invalid_request_error", "",
            "A `return_url` must be specified because this Payment Intent is configured to automatically "
            "accept "
            "the payment methods enabled in the Dashboard, some of which may require a full page redirect to "
            "succeed. If you do not want to accept redirect-based payment methods, set "
            "`automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` "
            "to "
            "`never` when creating Setup Intents and Payment Intents.");
    return std::nullopt;
}

}  // namespace

std::optional<http::response> validate(const std::string& path, const params& p, std::string_view version) {
    if (!cancelled_intent_id(path).empty()) {
        if (auto bad = only_known(p, {"cancellation_reason", "expand"})) return bad;
        if (auto bad = no_empty_strings(p)) return bad;
        auto reason = param(p, "cancellation_reason");
        if (p.count("cancellation_reason") && reason != "abandoned" && reason != "duplicate" &&
            reason != "fraudulent" && reason != "requested_by_customer")
            return error_response(400, "invalid_request_error", "",
                                  "Invalid cancellation_reason: must be one of abandoned, duplicate, "
                                  "fraudulent, or requested_by_customer",
                                  "cancellation_reason");
        return std::nullopt;
    }
    if (path == "/v1/refunds") {
        for (const auto& [k, v] : p) {
            auto top = k.substr(0, k.find('['));
            static const std::vector<std::string> allowed = {
                "charge", "payment_intent", "amount", "reason", "metadata", "expand", "instructions_email"};
            if (std::find(allowed.begin(), allowed.end(), top) == allowed.end())
                return error_response(400, "invalid_request_error", "parameter_unknown",
                                      "Received unknown parameter: " + k, k);
        }
        if (auto bad = no_empty_strings(p)) return bad;
        if (param(p, "charge").empty() && param(p, "payment_intent").empty())
            return error_response(400, "invalid_request_error", "parameter_missing",
                                  "One of the following params should be provided for this request: "
                                  "payment_intent or charge.");
        if (p.count("amount")) {
            auto a = to_int(param(p, "amount"));
            if (!a || *a <= 0)
                return error_response(400, "invalid_request_error", "parameter_invalid_integer",
                                      "Invalid positive integer", "amount");
        }
        auto reason = param(p, "reason");
        if (p.count("reason") && reason != "duplicate" && reason != "fraudulent" &&
            reason != "requested_by_customer")
            return error_response(
                400, "invalid_request_error", "",
                "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer", "reason");
        return std::nullopt;
    }
    if (path == "/v1/charges")
        return validate_common(p, {"amount", "currency", "customer", "description", "metadata", "expand",
                                   "capture", "statement_descriptor", "receipt_email", "source"});
    if (path == "/v1/payment_intents") return validate_intent(p, version);
    return error_response(404, "invalid_request_error", "resource_missing",
                          "Unrecognized request URL (POST: " + path + ")");
}

std::string fingerprint(const std::string& path, const params& p) {
    std::string f = path;
    for (const auto& [k, v] : p) f += "\n" + k + "=" + v;  // std::map: sorted, order-independent
    return f;
}

int qint(const http::request& req, std::string_view key, int dflt) {
    auto v = http::query_param(req.query(), key);
    if (!v) return dflt;
    auto n = to_int(*v);
    return n ? static_cast<int>(*n) : dflt;
}

}  // namespace cg::fake::stripe_impl
