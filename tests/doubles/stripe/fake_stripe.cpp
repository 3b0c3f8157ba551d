#include "tests/doubles/stripe/fake_stripe.hpp"

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator for large
// coroutines (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <type_traits>

#include "core/error.hpp"
#include "http/proto/message.hpp"
#include "net/timeout.hpp"
#include "stripe/form.hpp"

namespace cg::fake {
namespace {

using params = std::map<std::string, std::string>;

// Minimal JSON object writer.
class json_obj {
  public:
    json_obj& str(std::string_view k, std::string_view v) {
        key(k);
        append_json_string(s_, v);
        return *this;
    }
    json_obj& str_or_null(std::string_view k, std::string_view v) {
        return v.empty() ? raw(k, "null") : str(k, v);
    }
    json_obj& num(std::string_view k, std::int64_t v) { return raw(k, std::to_string(v)); }
    json_obj& boolean(std::string_view k, bool v) { return raw(k, v ? "true" : "false"); }
    json_obj& raw(std::string_view k, std::string_view json) {
        key(k);
        s_ += json;
        return *this;
    }
    std::string done() { return s_ + "}"; }

  private:
    void key(std::string_view k) {
        if (s_.size() > 1) s_ += ',';
        append_json_string(s_, k);
        s_ += ':';
    }
    std::string s_ = "{";
};

std::string meta_json(const std::vector<std::pair<std::string, std::string>>& m) {
    json_obj o;
    for (const auto& [k, v] : m) o.str(k, v);
    return o.done();
}

// Stripe's US bank account test payment methods (ACH Direct Debit, "Test account numbers"): the payment
// answers processing, then settles this way. `_processing` never settles by itself.
struct async_method {
    std::string_view pm, settles_to, failure_code;
};
constexpr async_method async_methods[] = {
    {"pm_usBankAccount_success", "succeeded", ""},
    {"pm_usBankAccount_accountClosed", "failed", "account_closed"},
    {"pm_usBankAccount_noAccount", "failed", "no_account"},
    {"pm_usBankAccount_insufficientFunds", "failed", "insufficient_funds"},
    {"pm_usBankAccount_debitNotAuthorized", "failed", "debit_not_authorized"},
    {"pm_usBankAccount_invalidCurrency", "failed", "invalid_currency"},
    {"pm_usBankAccount_dispute", "dispute", ""},
    {"pm_usBankAccount_processing", "", ""},
};

const async_method* async_method_of(std::string_view pm) {
    for (const auto& m : async_methods)
        if (m.pm == pm) return &m;
    return nullptr;
}

// What Stripe reports of the method that paid: a card, a PaymentIntent's US bank account, or a Charges-API
// bank debit (a `ba_…` source: type ach_debit).
std::string payment_method_details(const charge_rec& c) {
    if (c.payment_method.empty()) return "null";
    if (c.payment_method.starts_with("ba_"))
        return json_obj()
            .str("type", "ach_debit")
            .raw("ach_debit", json_obj()
                                  .str("account_holder_type", "individual")
                                  .str("bank_name", "STRIPE TEST BANK")
                                  .str("country", "US")
                                  .str("fingerprint", "fakeAchFingerprint")
                                  .str("last4", "6789")
                                  .str("routing_number", "110000000")
                                  .done())
            .done();
    if (async_method_of(c.payment_method))
        return json_obj()
            .str("type", "us_bank_account")
            .raw("us_bank_account", json_obj()
                                        .str("account_holder_type", "individual")
                                        .str("account_type", "checking")
                                        .str("bank_name", "STRIPE TEST BANK")
                                        .str("fingerprint", "fakeUsBankFingerprint")
                                        .str("last4", "6789")
                                        .str("routing_number", "110000000")
                                        .done())
            .done();
    return json_obj().str("type", "card").done();
}

std::string charge_json(const charge_rec& c) {
    bool ok = c.status == "succeeded";
    bool captured = c.status != "failed";  // a bank debit's pending charge is captured, not yet paid
    std::string failure_message = c.failure_message;
    if (failure_message.empty() && !c.failure_code.empty()) failure_message = "Your card was declined.";
    return json_obj()
        .str("id", c.id)
        .str("object", "charge")
        .num("amount", c.amount)
        .num("amount_captured", captured ? c.amount : 0)
        .num("amount_refunded", c.amount_refunded)
        .raw("billing_details", R"({"address":null,"email":null,"name":null,"phone":null})")
        .boolean("captured", captured)
        .num("created", c.created)
        .str("currency", c.currency)
        .str_or_null("customer", c.customer)
        .str_or_null("description", c.description)
        .boolean("disputed", c.disputed)
        .str_or_null("failure_code", c.failure_code)
        .str_or_null("failure_message", failure_message)
        .boolean("livemode", false)
        .raw("metadata", meta_json(c.metadata))
        .boolean("paid", ok)
        .str_or_null("payment_intent", c.payment_intent)
        .str_or_null("payment_method", c.payment_method)
        .raw("payment_method_details", payment_method_details(c))
        .boolean("refunded", c.amount > 0 && c.amount_refunded == c.amount)
        .str("status", c.status)
        .done();
}

std::string refund_json(const refund_rec& r) {
    return json_obj()
        .str("id", r.id)
        .str("object", "refund")
        .num("amount", r.amount)
        .str("charge", r.charge)
        .num("created", r.created)
        .str("currency", r.currency)
        .raw("metadata", meta_json(r.metadata))
        .str_or_null("payment_intent", r.payment_intent)
        .str_or_null("reason", r.reason)
        .str("status", r.status)
        .done();
}

std::string dispute_json(const dispute_rec& d) {
    return json_obj()
        .str("id", d.id)
        .str("object", "dispute")
        .num("amount", d.amount)
        .raw("balance_transactions", "[]")
        .str("charge", d.charge)
        .num("created", d.created)
        .str("currency", d.currency)
        .raw("evidence", R"({"customer_name":null,"product_description":null,"uncategorized_text":null})")
        .raw("evidence_details", json_obj()
                                     .num("due_by", d.created + 7 * 24 * 3600)
                                     .boolean("has_evidence", false)
                                     .boolean("past_due", false)
                                     .num("submission_count", 0)
                                     .done())
        // An inquiry withdraws nothing and the payment can still be refunded; a chargeback cannot.
        .boolean("is_charge_refundable", d.inquiry())
        .boolean("livemode", false)
        .raw("metadata", "{}")
        .str_or_null("payment_intent", d.payment_intent)
        .str("reason", d.reason)
        .str("status", d.status)
        .done();
}

std::string bank_failure_message(std::string_view code) {
    if (code == "insufficient_funds")
        return "The customer's account has insufficient funds to cover this payment.";
    if (code == "account_closed") return "The customer's bank account has been closed.";
    if (code == "no_account") return "The customer's bank account could not be located.";
    if (code == "debit_not_authorized")
        return "The customer has notified their bank that this payment was unauthorized.";
    if (code == "invalid_currency")
        return "The bank was unable to process this payment because of its currency.";
    return "The customer's bank could not process this payment.";
}

// "$25.00", as Stripe writes amounts in refund errors.
std::string money(std::int64_t minor, std::string_view currency) {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%lld.%02lld", static_cast<long long>(minor / 100),
                  static_cast<long long>(minor % 100));
    if (currency == "usd") return std::string("$") + digits;
    if (currency == "eur") return std::string("\u20ac") + digits;
    if (currency == "gbp") return std::string("\u00a3") + digits;
    return std::string(digits) + " " + std::string(currency);
}

// The first API version whose PaymentIntent has `latest_charge`; before it, the intent carried its charges as
// an embedded list `charges` instead.
constexpr std::string_view latest_charge_version = "2022-11-15";

// A PaymentIntent as API `version` renders it; `charges` are the fake's charges (an older version lists the
// intent's own, newest first).
std::string intent_json(const intent_rec& p, std::string_view version,
                        const std::vector<charge_rec>& charges) {
    std::string last_error = "null";
    if (!p.last_error_code.empty())
        last_error = json_obj()
                         .str("type", p.last_error_type)
                         .str("code", p.last_error_code)
                         .str("message",
                              p.last_error_message.empty() ? "Your card was declined." : p.last_error_message)
                         .done();
    std::string next_action = "null";
    if (p.status == "requires_action")
        next_action = json_obj().str("type", "use_stripe_sdk").raw("use_stripe_sdk", "{}").done();
    std::string latest_charge = "null";
    if (!p.latest_charge.empty()) append_json_string(latest_charge = {}, p.latest_charge);
    const bool embeds_charges = version < latest_charge_version;
    json_obj o;
    o.str("id", p.id).str("object", "payment_intent");
    if (embeds_charges) {
        std::string data = "[";
        std::int64_t n = 0;
        for (auto it = charges.rbegin(); it != charges.rend(); ++it)
            if (it->payment_intent == p.id) data += (n++ ? "," : "") + charge_json(*it);
        o.raw("charges", json_obj()
                             .str("object", "list")
                             .raw("data", data + "]")
                             .boolean("has_more", false)
                             .num("total_count", n)
                             .str("url", "/v1/charges?payment_intent=" + p.id)
                             .done());
    }
    std::string automatic = "null";
    if (p.automatic)
        automatic =
            json_obj().boolean("enabled", true).str_or_null("allow_redirects", p.allow_redirects).done();
    std::string types = "[";
    for (std::size_t i = 0; i < p.payment_method_types.size(); ++i) {
        if (i) types += ',';
        append_json_string(types, p.payment_method_types[i]);
    }
    o.num("amount", p.amount)
        .num("amount_received", p.status == "succeeded" ? p.amount : 0)
        .raw("automatic_payment_methods", automatic)
        .str_or_null("cancellation_reason", p.cancellation_reason)
        .str("capture_method", "automatic")
        .str("client_secret", p.id + "_secret_fake")
        .str("confirmation_method", "automatic")
        .num("created", p.created)
        .str("currency", p.currency)
        .str_or_null("customer", p.customer)
        .str_or_null("description", p.description)
        .raw("last_payment_error", last_error);
    if (!embeds_charges) o.raw("latest_charge", latest_charge);
    return o.boolean("livemode", false)
        .raw("metadata", meta_json(p.metadata))
        .raw("next_action", next_action)
        .str_or_null("payment_method", p.payment_method)
        .raw("payment_method_types", types + "]")
        .str("status", p.status)
        .done();
}

http::response json_response(int status, std::string body) {
    return http::make_response(status, std::move(body), "application/json");
}

std::string error_body(std::string_view type, std::string_view code, std::string_view message,
                       std::string_view param = {}, std::string_view extra_fields = {}) {
    json_obj e;
    e.str("type", type);
    if (!code.empty()) e.str("code", code);
    e.str("message", message);
    if (!param.empty()) e.str("param", param);
    std::string inner = e.done();
    if (!extra_fields.empty())
        inner = inner.substr(0, inner.size() - 1) + "," + std::string(extra_fields) + "}";
    return json_obj().raw("error", inner).done();
}

http::response error_response(int status, std::string_view type, std::string_view code,
                              std::string_view message, std::string_view param = {}) {
    return json_response(status, error_body(type, code, message, param));
}

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

// Sets the account objects and events are made in for one synchronous step, then puts the previous back.
struct account_scope {
    std::string& cur;
    std::string prev;
    account_scope(std::string& c, const std::string& now) : cur(c), prev(c) { cur = now; }
    ~account_scope() { cur = prev; }
    account_scope(const account_scope&) = delete;
    account_scope& operator=(const account_scope&) = delete;
};

// Stripe's published error codes for a parameter it refuses: `parameter_unknown`, `parameter_missing`,
// `parameter_invalid_empty` (an empty string: Stripe takes it for an attempt to unset the parameter),
// `parameter_invalid_integer`, `amount_too_large`. A value outside an enum or a malformed currency has no
// code, as at Stripe: only the type, the message and the param.
http::response unknown_parameter(const std::string& k) {
    return error_response(400, "invalid_request_error", "parameter_unknown",
                          "Received unknown parameter: " + k, k);
}

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

// "/v1/payment_intents/pi_…/cancel" → "pi_…"; empty for any other path.
std::string cancelled_intent_id(const std::string& path) {
    constexpr std::string_view prefix = "/v1/payment_intents/", suffix = "/cancel";
    if (!path.starts_with(prefix) || !path.ends_with(suffix) || path.size() <= prefix.size() + suffix.size())
        return {};
    auto id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    return id.find('/') == std::string::npos ? id : std::string();
}

// The payment method types a PaymentIntent create accepts, per Stripe's rules for `version`: an explicit
// `payment_method_types[]`; else automatic payment methods when asked for, and by default from API version
// 2023-08-16 on; else (an older version, nothing asked) ["card"]. Only what the fake can tell apart matters:
// whether a bank debit is allowed and whether redirect-based methods are (automatic, allow_redirects not
// never).
struct intent_methods {
    bool automatic = false;
    bool redirects = false;
    std::vector<std::string> types;  // explicit or the ["card"] default; empty when automatic
};

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

// What a create request says of a charge or a PaymentIntent alike.
template <typename Rec>
void read_payment_params(Rec& r, const params& p) {
    r.amount = to_int(param(p, "amount")).value_or(0);
    r.currency = param(p, "currency");
    r.customer = param(p, "customer");
    r.description = param(p, "description");
    r.metadata = metadata_of(p);
}

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

}  // namespace

fake_stripe::fake_stripe(asio::any_io_executor ex, std::shared_ptr<asio::ssl::context> tls, logger log,
                         std::size_t max_connections)
    : ex_(ex), log_(log) {
    http::router r;
    r.add_prefix("", "/v1/", [this](http::request& q) { return api(q); });
    r.add_prefix("", "/_admin/", [this](http::request& q) { return admin(q); });
    http::server_options o;
    o.tls = std::move(tls);
    o.max_connections = max_connections;
    o.server_name = "fake-stripe";
    server_ = std::make_unique<http::server>(ex, std::move(r), std::move(o), log_);
    webhooks_ = std::make_unique<fake::webhook_sender>(ex, log_, [this] { return now(); });
}

fake_stripe::~fake_stripe() {
    *alive_ = false;
}

result<net::tcp::endpoint> fake_stripe::listen(const net::host_port& where) {
    return server_->listen(where);
}
void fake_stripe::start() {
    server_->start();
}
void fake_stripe::stop() {
    server_->stop();
}

void fake_stripe::set_limits(const limits& l) {
    limiter_.set(l, std::chrono::steady_clock::now());
    for (auto& [account, one] : account_limiters_) one.set(l, std::chrono::steady_clock::now());
}

void fake_stripe::add_account(const std::string& account, const std::vector<std::string>& customers) {
    auto& known = accounts_[account];
    for (const auto& c : customers)
        if (std::find(known.begin(), known.end(), c) == known.end()) known.push_back(c);
}

void fake_stripe::decline(std::string customer, decline_rule rule) {
    declines_[std::move(customer)] = std::move(rule);
}

std::int64_t fake_stripe::now() const {
    auto t = std::chrono::system_clock::now() + clock_offset_;
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

int fake_stripe::posts_for(const std::string& key) const {
    auto it = posts_.find(key);
    return it == posts_.end() ? 0 : it->second;
}

void fake_stripe::reset() {
    faults_ = {};
    declines_.clear();
    charges_.clear();
    intents_.clear();
    refunds_.clear();
    disputes_.clear();
    bank_outcomes_.clear();
    default_methods_.clear();
    default_sources_.clear();
    events_.clear();
    webhooks_->reset();
    ++settle_gen_;
    pending_settle_ = 0;
    idem_.clear();
    posts_.clear();
    accounts_.clear();
    fault_hits_.clear();
    clock_offset_ = std::chrono::seconds(0);
    max_active_ = active_;
}

std::string fake_stripe::new_id(const char* prefix) {
    static constexpr char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    std::string id = prefix;
    std::uniform_int_distribution<int> pick(0, 61);
    for (int i = 0; i < 24; ++i) id += alphabet[pick(rng_)];
    return id;
}

asio::awaitable<void> fake_stripe::delay(bool stall_ok, const std::string& path) {
    int ms = faults_.latency_ms;
    if (faults_.latency_jitter_ms > 0)
        ms += std::uniform_int_distribution<int>(0, faults_.latency_jitter_ms)(rng_);
    if (stall_ok && faults_.stall_count > 0) {
        --faults_.stall_count;
        ++fault_hits_["stall " + path];
        ms += faults_.stall_ms;
    }
    if (ms > 0) co_await net::sleep_for(std::chrono::milliseconds(ms));
}

asio::awaitable<http::response> fake_stripe::api(http::request& req) {
    ++requests_;
    std::string rid = "req_" + std::to_string(++next_req_);
    struct active_guard {
        fake_stripe* f;
        explicit active_guard(fake_stripe* x) : f(x) {
            f->max_active_ = std::max(f->max_active_, ++f->active_);
        }
        ~active_guard() { --f->active_; }
    } guard(this);

    http::response resp;
    auto auth = req.headers.get("Authorization").value_or("");
    const bool authenticated = auth.starts_with("Bearer sk_") || auth.starts_with("Bearer rk_");
    auto account_header = req.headers.get("Stripe-Account");
    const std::string account(account_header.value_or(""));
    const bool reachable = !account_header || (well_formed_account(account) && accounts_.count(account));
    limiter::verdict admitted = limiter::verdict::ok;
    if (authenticated && reachable) {
        // Each account is limited on its own: a connected account's requests spend its bucket only.
        auto& lim = account.empty() ? limiter_ : account_limiters_.try_emplace(account).first->second;
        if (!account.empty() && lim.changes() == 0 && limiter_.changes() > 0)
            lim.set(limiter_.get(), std::chrono::steady_clock::now());
        admitted = lim.admit(limiter::endpoint_of(req.method, req.path()), std::chrono::steady_clock::now(),
                             active_ - 1);
    }
    if (!authenticated) {
        resp = error_response(401, "invalid_request_error", "", "Invalid API Key provided.");
    } else if (!reachable) {
        // Stripe's answer to a Stripe-Account the key cannot act for (unknown, not connected, malformed).
        resp = error_response(403, "invalid_request_error", "account_invalid",
                              "The provided key '" + std::string(auth.substr(7, 8)) +
                                  "***' does not have access to account '" + account +
                                  "' (or that account does not exist). Application access may have been "
                                  "revoked.");
    } else if (admitted != limiter::verdict::ok) {
        // Rate limiting runs before idempotency: nothing is saved, the same key may be sent again.
        resp = error_response(
            429, "invalid_request_error", "rate_limit",
            admitted == limiter::verdict::rate_limited
                ? "Request rate limit exceeded. You can learn more about rate limits here "
                  "https://stripe.com/docs/rate-limits."
                : "Request concurrency limit exceeded. You can learn more about rate limits here "
                  "https://stripe.com/docs/rate-limits.");
        resp.headers.add("Stripe-Should-Retry", "true");
    } else if (req.method == "POST") {
        resp = co_await post(req, rid);
    } else {
        co_await delay(true, std::string(req.path()));
        resp = get(req);
    }
    resp.headers.add("Request-Id", rid);
    if (record_requests_)
        request_log_.push_back({req.method, std::string(req.path()), std::string(req.query()), req.body,
                                std::string(req.headers.get("Stripe-Version").value_or("")), account,
                                resp.status, resp.body});
    co_return resp;
}

asio::awaitable<http::response> fake_stripe::post(http::request& req, std::string rid) {
    std::string key(req.headers.get("Idempotency-Key").value_or(""));
    const std::string account = account_of(req);
    // Idempotency keys are per account: the same key on two accounts is two requests.
    const std::string idem_key = account.empty() ? key : account + "\n" + key;
    if (!key.empty()) ++posts_[key];
    if (key.size() > 255)
        co_return error_response(400, "invalid_request_error", "",
                                 "Idempotency-Key must be at most 255 characters");
    // Rate limiting runs before idempotency: nothing is saved.
    if (faults_.rate_limit > 0 && faults_.targets(req.path())) {
        --faults_.rate_limit;
        ++fault_hits_["rate_limit " + std::string(req.path())];
        auto r = error_response(429, "invalid_request_error", "rate_limit",
                                "Too many requests hit the API too quickly.");
        r.headers.add("Stripe-Should-Retry", "true");
        co_return r;
    }
    auto decoded = stripe::decode_form(req.body);
    if (!decoded) co_return error_response(400, "invalid_request_error", "", "Invalid request body");
    params p(decoded->begin(), decoded->end());
    std::string path(req.path());
    std::string fp = fingerprint(path, p);

    if (!key.empty()) {
        auto it = idem_.find(idem_key);
        if (it != idem_.end() && now() - it->second.created >= 24 * 3600) {
            idem_.erase(it);  // pruned: the key starts a new request
            it = idem_.end();
        }
        if (it != idem_.end()) {
            if (it->second.fingerprint != fp)
                co_return error_response(
                    400, "idempotency_error", "",
                    "Keys for idempotent requests can only be used with the same parameters they "
                    "were first used with. Try using a key other than '" +
                        key + "' if you meant to execute a different request.");
            if (it->second.executing) {
                auto r =
                    error_response(409, "idempotency_error", "idempotency_key_in_use",
                                   "There is currently another in-progress request using this Idempotent Key "
                                   "(that probably means you submitted twice, and the other request is still "
                                   "going through): " +
                                       key + ". Please try again later.");
                r.headers.add("Stripe-Should-Retry", "true");
                co_return r;
            }
            auto r = json_response(it->second.status, it->second.body);
            r.headers.add("Idempotent-Replayed", "true");
            r.headers.add("Original-Request", it->second.request_id);
            r.headers.add("Idempotency-Key", key);
            co_return r;
        }
        if (faults_.in_use > 0 && faults_.targets(path)) {
            --faults_.in_use;
            auto r =
                error_response(409, "idempotency_error", "idempotency_key_in_use",
                               "There is currently another in-progress request using this Idempotent Key.");
            r.headers.add("Stripe-Should-Retry", "true");
            co_return r;
        }
    }
    // Validation failures are not saved: the same key may be used again with fixed parameters.
    // The API version the request is rendered and validated in: its Stripe-Version, else the account's
    // default.
    const std::string version(req.headers.get("Stripe-Version").value_or(default_api_version_));
    if (auto bad = validate(path, p, version)) co_return std::move(*bad);
    if (!account.empty() && (path == "/v1/charges" || path == "/v1/payment_intents")) {
        // A connected account has only its own customers (the platform's are not shared).
        const auto& known = accounts_[account];
        if (std::find(known.begin(), known.end(), param(p, "customer")) == known.end())
            co_return error_response(400, "invalid_request_error", "resource_missing",
                                     "No such customer: '" + param(p, "customer") + "'", "customer");
    }
    if (!key.empty()) idem_[idem_key] = idem_rec{fp, true, 0, {}, rid, now()};

    co_await delay(true, path);
    int status = 0;
    std::string body;
    bool created = false;
    cur_request_id_ = rid;
    cur_idem_key_ = key;
    cur_account_ = account;
    cur_version_ = version;
    if (path == "/v1/charges")
        create_charge(p, status, body, created);
    else if (path == "/v1/payment_intents")
        create_intent(p, status, body, created);
    else if (path == "/v1/refunds")
        create_refund(p, status, body, created);
    else
        cancel_intent(cancelled_intent_id(path), p, status, body);
    cur_request_id_.clear();
    cur_idem_key_.clear();
    cur_account_.clear();
    cur_version_ = default_api_version_;
    if (created && faults_.fail_after_create > 0 && faults_.targets(path)) {
        --faults_.fail_after_create;
        ++fault_hits_["fail_after_create " + path];
        status = 500;
        body = error_body("api_error", "", "An unknown error occurred");
    }
    bool drop = created && status == 200 && faults_.drop_after_create > 0 && faults_.targets(path);
    if (drop) {
        --faults_.drop_after_create;
        ++fault_hits_["drop_after_create " + path];
    }
    if (!key.empty()) {
        // Saved once the endpoint executed, success or failure, 500s included. (reset() may have run.)
        if (auto it = idem_.find(idem_key);
            it != idem_.end() && it->second.executing && it->second.request_id == rid) {
            it->second.executing = false;
            it->second.status = status;
            it->second.body = body;
        }
    }
    auto r = json_response(status, std::move(body));
    if (!key.empty()) r.headers.add("Idempotency-Key", key);
    r.abort_connection = drop;
    co_return r;
}

charge_rec& fake_stripe::new_charge(const params& p, const decline_rule* declined) {
    charge_rec c;
    c.id = new_id("ch_");
    read_payment_params(c, p);
    c.created = now();
    c.status = declined ? "failed" : "succeeded";
    if (declined) c.failure_code = declined->code;
    c.seq = ++seq_;
    c.account = cur_account_;
    charges_.push_back(std::move(c));
    return charges_.back();
}

void fake_stripe::create_charge(const params& p, int& status, std::string& body, bool& created) {
    // A bank debit through the Charges API: a `ba_…` source named, or the customer's default source is a
    // bank account. Stripe answers 200 with a `pending` charge (payment_method_details.type ach_debit) that
    // succeeds or fails days later (charge.succeeded / charge.failed).
    std::string source = param(p, "source");
    if (source.empty())
        if (auto ds = default_sources_.find(param(p, "customer")); ds != default_sources_.end())
            source = ds->second;
    if (source.starts_with("ba_")) {
        auto& c = new_charge(p, nullptr);
        c.status = "pending";
        c.payment_method = source;
        c.settles_to = "succeeded";
        if (auto o = bank_outcomes_.find(c.customer); o != bank_outcomes_.end()) {
            c.settles_to = o->second.first;
            c.settle_failure_code = o->second.second;
        }
        created = true;
        status = 200;
        body = charge_json(c);
        emit("charge.pending", body, c.id, c.id);
        schedule_charge_settlement(c.id);
        return;
    }
    auto d = declines_.find(param(p, "customer"));
    const decline_rule* rule = d == declines_.end() ? nullptr : &d->second;
    auto& c = new_charge(p, rule);
    created = true;
    emit(rule ? "charge.failed" : "charge.succeeded", charge_json(c), c.id, c.id);
    if (!rule) {
        status = 200;
        body = charge_json(c);
        return;
    }
    status = 402;
    std::string fields = "\"charge\":\"" + c.id + "\"";
    if (rule->code == "card_declined") fields += ",\"decline_code\":\"" + rule->decline_code + "\"";
    body = error_body("card_error", rule->code, "Your card was declined.", {}, fields);
}

void fake_stripe::create_intent(const params& p, int& status, std::string& body, bool& created) {
    intent_rec pi;
    pi.id = new_id("pi_");
    read_payment_params(pi, p);
    pi.payment_method = param(p, "payment_method");
    const auto methods = methods_of(p, cur_version_);
    pi.automatic = methods.automatic;
    if (methods.automatic) {
        pi.allow_redirects = param(p, "automatic_payment_methods[allow_redirects]");
        if (pi.allow_redirects.empty()) pi.allow_redirects = "always";
        pi.payment_method_types = {"card", "us_bank_account"};
    } else {
        pi.payment_method_types = methods.types;
    }
    pi.created = now();
    pi.account = cur_account_;
    created = true;
    // A 200 with the intent left in `now_status`, announced by `event`.
    auto answer_unfinished = [&](const char* now_status, const char* event) {
        pi.status = now_status;
        status = 200;
        body = intent_json(pi, cur_version_, charges_);
        emit(event, intent_view(pi), pi.id, pi.id);
        intents_.push_back(std::move(pi));
    };
    if (param(p, "confirm") != "true")
        return answer_unfinished("requires_confirmation", "payment_intent.created");
    pi.status = "requires_payment_method";
    emit("payment_intent.created", intent_view(pi), pi.id, pi.id);
    if (const auto* m = async_method_of(pi.payment_method)) {
        // A bank debit: processing now, its pending charge settles later (or never, for _processing).
        auto& c = new_charge(p, nullptr);
        c.status = "pending";
        c.payment_intent = pi.id;
        c.payment_method = pi.payment_method;
        pi.latest_charge = c.id;
        pi.status = "processing";
        pi.settles_to = std::string(m->settles_to);
        pi.settle_failure_code = std::string(m->failure_code);
        if (auto o = bank_outcomes_.find(pi.customer); o != bank_outcomes_.end()) {
            pi.settles_to = o->second.first;
            pi.settle_failure_code = o->second.second;
        }
        status = 200;
        body = intent_json(pi, cur_version_, charges_);
        emit("payment_intent.processing", intent_view(pi), pi.id, pi.id);
        emit("charge.pending", charge_json(c), c.id, pi.id);
        auto id = pi.id;
        bool settles = !pi.settles_to.empty();
        intents_.push_back(std::move(pi));
        if (settles) schedule_settlement(id);
        return;
    }
    auto d = declines_.find(pi.customer);
    const decline_rule* rule = d == declines_.end() ? nullptr : &d->second;
    if (rule && rule->code == "authentication_required" && param(p, "off_session") != "true") {
        // On-session: the customer is there to authenticate. No charge until they do.
        return answer_unfinished("requires_action", "payment_intent.requires_action");
    }
    auto& c = new_charge(p, rule);
    c.payment_intent = pi.id;
    c.payment_method = pi.payment_method;
    pi.latest_charge = c.id;
    pi.status = rule ? "requires_payment_method" : "succeeded";
    if (rule) pi.last_error_code = rule->code;
    emit(rule ? "charge.failed" : "charge.succeeded", charge_json(c), c.id, pi.id);
    emit(rule ? "payment_intent.payment_failed" : "payment_intent.succeeded", intent_view(pi), pi.id, pi.id);
    if (!rule) {
        status = 200;
        body = intent_json(pi, cur_version_, charges_);
    } else {
        status = 402;
        std::string fields =
            "\"charge\":\"" + c.id + "\",\"payment_intent\":" + intent_json(pi, cur_version_, charges_);
        if (rule->code == "card_declined") fields += ",\"decline_code\":\"" + rule->decline_code + "\"";
        std::string msg = rule->code == "authentication_required"
                              ? "Your card was declined. This transaction requires authentication."
                              : "Your card was declined.";
        body = error_body("card_error", rule->code, msg, {}, fields);
    }
    intents_.push_back(std::move(pi));
}

// POST /v1/payment_intents/{id}/cancel: any status but succeeded or canceled → canceled (Stripe's rule).
void fake_stripe::cancel_intent(const std::string& id, const params& p, int& status, std::string& body) {
    auto it = std::find_if(intents_.begin(), intents_.end(),
                           [&](const intent_rec& r) { return r.id == id && r.account == cur_account_; });
    if (it == intents_.end()) {
        status = 404;
        body = error_body("invalid_request_error", "resource_missing", "No such payment_intent: '" + id + "'",
                          "intent");
        return;
    }
    if (it->status == "succeeded" || it->status == "canceled") {
        status = 400;
        body = error_body("invalid_request_error", "payment_intent_unexpected_state",
                          "You cannot cancel this PaymentIntent because it has a status of " + it->status +
                              ". Only a PaymentIntent with one of the following statuses may be canceled: "
                              "requires_payment_method, requires_capture, requires_confirmation, "
                              "requires_action, processing.");
        return;
    }
    bool was_processing = it->status == "processing";
    it->status = "canceled";
    it->cancellation_reason = param(p, "cancellation_reason");
    if (was_processing)
        if (auto* c = find_charge(it->latest_charge); c && c->status == "pending") c->status = "failed";
    status = 200;
    body = intent_json(*it, cur_version_, charges_);
    emit("payment_intent.canceled", intent_view(*it), it->id, it->id);
}

charge_rec* fake_stripe::find_charge(const std::string& id) {
    for (auto& c : charges_)
        if (c.id == id) return &c;
    return nullptr;
}

intent_rec* fake_stripe::find_intent(const std::string& id) {
    for (auto& p : intents_)
        if (p.id == id) return &p;
    return nullptr;
}

fake_stripe::render_fn fake_stripe::intent_view(const intent_rec& pi) const {
    return [this, pi](std::string_view version) { return intent_json(pi, version, charges_); };
}

void fake_stripe::emit(const std::string& type, const std::string& object_json, const std::string& object_id,
                       const std::string& group) {
    emit(
        type, [&](std::string_view) { return object_json; }, object_id, group);
}

// An event is made once, in the account's default API version (what GET /v1/events shows); the webhook
// endpoint gets it rendered in its own API version when it has one, as Stripe renders each endpoint's
// events: `api_version` and the object's shape both follow it.
void fake_stripe::emit(const std::string& type, const render_fn& object, const std::string& object_id,
                       const std::string& group, const std::string& previous_attributes) {
    event_rec e;
    e.id = new_id("evt_");
    e.type = type;
    e.object_id = object_id;
    e.account = cur_account_;
    e.created = now();
    std::string request =
        cur_request_id_.empty()
            ? std::string(R"({"id":null,"idempotency_key":null})")
            : json_obj().str("id", cur_request_id_).str_or_null("idempotency_key", cur_idem_key_).done();
    auto render = [&](std::string_view version) {
        json_obj head;
        head.str("id", e.id).str("object", "event");
        // A connected account's event names it, as Stripe's Connect events do.
        if (!e.account.empty()) head.str("account", e.account);
        return pretty_json(head.str("api_version", version)
                               .num("created", e.created)
                               .raw("data", previous_attributes.empty()
                                                ? json_obj().raw("object", object(version)).done()
                                                : json_obj()
                                                      .raw("object", object(version))
                                                      .raw("previous_attributes", previous_attributes)
                                                      .done())
                               .boolean("livemode", false)
                               .num("pending_webhooks", webhooks_->enabled(type) ? 1 : 0)
                               .raw("request", request)
                               .str("type", type)
                               .done());
    };
    e.body = render(default_api_version_);
    const auto& endpoint_version = webhooks_->endpoint().api_version;
    webhooks_->send({e.id, e.type, group,
                     endpoint_version.empty() || endpoint_version == default_api_version_
                         ? e.body
                         : render(endpoint_version)});
    events_.push_back(std::move(e));
    webhooks_->notify();
}

namespace {

// A card PaymentMethod attached to `customer`, as API version 2024-06-20 renders it.
std::string card_payment_method_json(const std::string& id, const std::string& customer,
                                     std::int64_t created) {
    const std::string address =
        R"({"city":null,"country":null,"line1":null,"line2":null,"postal_code":null,"state":null})";
    return json_obj()
        .str("id", id)
        .str("object", "payment_method")
        .str("allow_redisplay", "unspecified")
        .raw("billing_details", json_obj()
                                    .raw("address", address)
                                    .raw("email", "null")
                                    .raw("name", "null")
                                    .raw("phone", "null")
                                    .done())
        .raw("card", json_obj()
                         .str("brand", "visa")
                         .raw("checks", R"({"address_line1_check":null,"address_postal_code_check":null,)"
                                        R"("cvc_check":"pass"})")
                         .str("country", "US")
                         .str("display_brand", "visa")
                         .num("exp_month", 12)
                         .num("exp_year", 2034)
                         .str("fingerprint", "Xt5EWLLDS7FJjR1c")
                         .str("funding", "credit")
                         .raw("generated_from", "null")
                         .str("last4", "4242")
                         .raw("networks", R"({"available":["visa"],"preferred":null})")
                         .raw("three_d_secure_usage", R"({"supported":true})")
                         .raw("wallet", "null")
                         .done())
        .num("created", created)
        .str("customer", customer)
        .boolean("livemode", false)
        .raw("metadata", "{}")
        .str("type", "card")
        .done();
}

// A Customer as API version 2024-06-20 renders it, with its invoice_settings.default_payment_method.
std::string customer_json(const std::string& id, const std::string& default_method, std::int64_t created) {
    return json_obj()
        .str("id", id)
        .str("object", "customer")
        .raw("address", "null")
        .num("balance", 0)
        .num("created", created)
        .raw("currency", "null")
        .raw("default_source", "null")
        .boolean("delinquent", false)
        .raw("description", "null")
        .raw("discount", "null")
        .raw("email", "null")
        .str("invoice_prefix", "CG0FAKE1")
        .raw("invoice_settings", json_obj()
                                     .raw("custom_fields", "null")
                                     .str_or_null("default_payment_method", default_method)
                                     .raw("footer", "null")
                                     .raw("rendering_options", "null")
                                     .done())
        .boolean("livemode", false)
        .raw("metadata", "{}")
        .raw("name", "null")
        .num("next_invoice_sequence", 1)
        .raw("phone", "null")
        .raw("preferred_locales", "[]")
        .raw("shipping", "null")
        .str("tax_exempt", "none")
        .raw("test_clock", "null")
        .done();
}

}  // namespace

std::string fake_stripe::attach_payment_method(const std::string& customer, const std::string& account) {
    declines_.erase(customer);
    const std::string id = new_id("pm_");
    const std::string object = card_payment_method_json(id, customer, now());
    cur_account_ = account;
    emit("payment_method.attached", object, id, id);
    cur_account_.clear();
    return id;
}

void fake_stripe::set_default_payment_method(const std::string& customer, const std::string& payment_method,
                                             const std::string& account) {
    auto& current = default_methods_[customer];
    const std::string previous =
        json_obj()
            .raw("invoice_settings", json_obj().str_or_null("default_payment_method", current).done())
            .done();
    current = payment_method;
    const std::string object = customer_json(customer, payment_method, now());
    cur_account_ = account;
    emit(
        "customer.updated", [&](std::string_view) { return object; }, customer, customer, previous);
    cur_account_.clear();
}

void fake_stripe::bank_outcome(std::string customer, std::string outcome, std::string failure_code) {
    bank_outcomes_[std::move(customer)] = {std::move(outcome), std::move(failure_code)};
}

void fake_stripe::schedule_settlement(const std::string& intent_id) {
    ++pending_settle_;
    auto body = [](fake_stripe* self, std::shared_ptr<bool> alive, std::uint64_t gen, std::string id,
                   std::chrono::milliseconds after) -> asio::awaitable<void> {
        co_await net::sleep_for(after);
        if (!*alive || gen != self->settle_gen_) co_return;
        --self->pending_settle_;
        auto* pi = self->find_intent(id);
        if (pi && pi->status == "processing") self->settle(id, pi->settles_to, pi->settle_failure_code);
        self->webhooks_->notify();
    };
    asio::co_spawn(ex_, body(this, alive_, settle_gen_, intent_id, settle_after_), asio::detached);
}

void fake_stripe::schedule_charge_settlement(const std::string& charge_id) {
    ++pending_settle_;
    auto body = [](fake_stripe* self, std::shared_ptr<bool> alive, std::uint64_t gen, std::string id,
                   std::chrono::milliseconds after) -> asio::awaitable<void> {
        co_await net::sleep_for(after);
        if (!*alive || gen != self->settle_gen_) co_return;
        --self->pending_settle_;
        auto* c = self->find_charge(id);
        if (c && c->status == "pending") self->settle_charge(id, c->settles_to, c->settle_failure_code);
        self->webhooks_->notify();
    };
    asio::co_spawn(ex_, body(this, alive_, settle_gen_, charge_id, settle_after_), asio::detached);
}

bool fake_stripe::settle_charge(const std::string& charge_id, const std::string& outcome,
                                const std::string& failure_code) {
    auto* c = find_charge(charge_id);
    if (!c || c->status != "pending" || !c->payment_intent.empty()) return false;
    account_scope in_account(cur_account_, c->account);
    if (outcome == "failed") {
        auto code = failure_code.empty() ? std::string("insufficient_funds") : failure_code;
        c->status = "failed";
        c->failure_code = code;
        c->failure_message = bank_failure_message(code);
        emit("charge.failed", charge_json(*c), c->id, c->id);
        return true;
    }
    c->status = "succeeded";
    emit("charge.succeeded", charge_json(*c), c->id, c->id);
    return true;
}

bool fake_stripe::settle(const std::string& intent_id, const std::string& outcome,
                         const std::string& failure_code) {
    auto* pi = find_intent(intent_id);
    if (!pi || pi->status != "processing") return false;
    auto* c = find_charge(pi->latest_charge);
    if (!c) return false;
    account_scope in_account(cur_account_, pi->account);
    if (outcome == "failed") {
        auto code = failure_code.empty() ? std::string("insufficient_funds") : failure_code;
        c->status = "failed";
        c->failure_code = code;
        c->failure_message = bank_failure_message(code);
        pi->status = "requires_payment_method";
        pi->last_error_code = code;
        pi->last_error_type = "invalid_request_error";
        pi->last_error_message = c->failure_message;
        emit("charge.failed", charge_json(*c), c->id, pi->id);
        emit("payment_intent.payment_failed", intent_view(*pi), pi->id, pi->id);
        return true;
    }
    c->status = "succeeded";
    pi->status = "succeeded";
    emit("charge.succeeded", charge_json(*c), c->id, pi->id);
    emit("payment_intent.succeeded", intent_view(*pi), pi->id, pi->id);
    if (outcome == "dispute") open_dispute(c->id);
    return true;
}

std::string fake_stripe::open_dispute(const std::string& charge_id, const std::string& reason,
                                      std::int64_t amount, bool inquiry) {
    auto* c = find_charge(charge_id);
    if (!c || c->status != "succeeded" || c->disputed) return {};
    account_scope in_account(cur_account_, c->account);
    dispute_rec d;
    d.account = c->account;
    d.id = new_id("dp_");
    d.charge = c->id;
    d.payment_intent = c->payment_intent;
    d.currency = c->currency;
    d.amount = amount > 0 ? amount : c->amount - c->amount_refunded;
    if (!reason.empty()) d.reason = reason;
    d.status = inquiry ? "warning_needs_response" : "needs_response";
    d.created = now();
    c->disputed = true;
    const auto group = c->payment_intent.empty() ? c->id : c->payment_intent;
    emit("charge.dispute.created", dispute_json(d), d.id, group);
    if (!inquiry) emit("charge.dispute.funds_withdrawn", dispute_json(d), d.id, group);
    disputes_.push_back(d);
    return d.id;
}

// Stripe's dispute lifecycle: which status may follow which, and the events each step makes.
bool fake_stripe::update_dispute(const std::string& dispute_id, const std::string& status) {
    auto d = std::find_if(disputes_.begin(), disputes_.end(),
                          [&](const dispute_rec& x) { return x.id == dispute_id; });
    if (d == disputes_.end() || d->closed()) return false;
    const std::string& from = d->status;
    const bool allowed =
        (from == "warning_needs_response" &&
         (status == "warning_under_review" || status == "warning_closed" || status == "needs_response")) ||
        (from == "warning_under_review" && (status == "warning_closed" || status == "needs_response")) ||
        (from == "needs_response" && (status == "under_review" || status == "won" || status == "lost")) ||
        (from == "under_review" && (status == "won" || status == "lost"));
    if (!allowed) return false;
    const bool escalated = d->inquiry() && status == "needs_response";
    d->status = status;
    account_scope in_account(cur_account_, d->account);
    const auto group = d->payment_intent.empty() ? d->charge : d->payment_intent;
    const auto body = dispute_json(*d);
    if (d->closed()) {
        emit("charge.dispute.closed", body, d->id, group);
        if (status == "won") emit("charge.dispute.funds_reinstated", body, d->id, group);
    } else {
        emit("charge.dispute.updated", body, d->id, group);
        if (escalated) emit("charge.dispute.funds_withdrawn", body, d->id, group);
    }
    return true;
}

bool fake_stripe::close_dispute(const std::string& dispute_id, const std::string& status) {
    if (status != "won" && status != "lost" && status != "warning_closed") return false;
    return update_dispute(dispute_id, status);
}

bool fake_stripe::end_refund(const std::string& refund_id, const std::string& status) {
    if (status != "failed" && status != "canceled") return false;
    for (auto& r : refunds_) {
        if (r.id != refund_id) continue;
        if (r.status == "failed" || r.status == "canceled") return false;
        r.status = status;
        // The amount goes back to the charge, as at Stripe: its amount_refunded drops.
        if (auto* c = find_charge(r.charge))
            c->amount_refunded = std::max<std::int64_t>(0, c->amount_refunded - r.amount);
        const std::string group = r.payment_intent.empty() ? r.charge : r.payment_intent;
        const auto body = refund_json(r);
        account_scope in_account(cur_account_, r.account);
        emit("refund.updated", body, r.id, group);
        emit("charge.refund.updated", body, r.id, group);
        return true;
    }
    return false;
}

// POST /v1/refunds: the whole unrefunded amount unless `amount` says less; Stripe's errors otherwise.
void fake_stripe::create_refund(const params& p, int& status, std::string& body, bool& created) {
    // Stripe's 400 for a refund it refuses.
    auto refuse = [&](const char* code, const std::string& message, std::string_view param_name = {}) {
        status = 400;
        body = error_body("invalid_request_error", code, message, param_name);
    };
    charge_rec* c = nullptr;
    auto charge_id = param(p, "charge"), pi_id = param(p, "payment_intent");
    if (!charge_id.empty()) {
        c = find_charge(charge_id);
        if (!c || c->account != cur_account_)
            return refuse("resource_missing", "No such charge: '" + charge_id + "'", "charge");
    } else {
        auto* pi = find_intent(pi_id);
        if (!pi || pi->account != cur_account_)
            return refuse("resource_missing", "No such payment_intent: '" + pi_id + "'", "payment_intent");
        c = find_charge(pi->latest_charge);
        if (!c || c->status != "succeeded")
            return refuse("charge_not_refundable",
                          "This PaymentIntent does not have a successful charge to refund.",
                          "payment_intent");
    }
    const bool chargeback = std::any_of(disputes_.begin(), disputes_.end(), [&](const dispute_rec& d) {
        return d.charge == c->id && !d.inquiry();
    });
    if (chargeback)
        return refuse("charge_disputed",
                      "Charge " + c->id + " has been charged back; cannot issue a refund.");
    if (c->status != "succeeded")
        return refuse("charge_not_refundable",
                      "Charge " + c->id + " has not succeeded; cannot issue a refund.");
    std::int64_t left = c->amount - c->amount_refunded;
    if (left == 0)
        return refuse("charge_already_refunded", "Charge " + c->id + " has already been refunded.");
    std::int64_t amount = p.count("amount") ? to_int(param(p, "amount")).value_or(0) : left;
    if (amount > left)
        return refuse("amount_too_large",
                      "Refund amount (" + money(amount, c->currency) +
                          ") is greater than unrefunded amount on charge (" + money(left, c->currency) + ")",
                      "amount");
    refund_rec r;
    r.id = new_id("re_");
    r.amount = amount;
    r.charge = c->id;
    r.payment_intent = c->payment_intent;
    r.currency = c->currency;
    r.reason = param(p, "reason");
    r.created = now();
    r.metadata = metadata_of(p);
    r.account = cur_account_;
    c->amount_refunded += amount;
    created = true;
    status = 200;
    body = refund_json(r);
    emit("charge.refunded", charge_json(*c), c->id, c->payment_intent.empty() ? c->id : c->payment_intent);
    emit("refund.created", body, r.id, c->payment_intent.empty() ? c->id : c->payment_intent);
    refunds_.push_back(std::move(r));
}

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

asio::awaitable<http::response> fake_stripe::admin(http::request& req) {
    std::string path(req.path());
    auto form = stripe::decode_form(req.body);
    params p = form ? params(form->begin(), form->end()) : params();
    auto num = [&](const char* k, int& field) {
        if (auto v = p.find(k); v != p.end()) field = static_cast<int>(to_int(v->second).value_or(field));
    };
    if (path == "/_admin/charges") co_return admin_list(charges_, charge_json);
    if (path == "/_admin/intents")
        co_return admin_list(
            intents_, [this](const intent_rec& r) { return intent_json(r, default_api_version_, charges_); });
    if (path == "/_admin/posts") {
        auto key = http::query_param(req.query(), "key").value_or("");
        co_return json_response(200, json_obj().str("key", key).num("count", posts_for(key)).done());
    }
    if (path == "/_admin/faults" && req.method == "POST") {
        num("latency_ms", faults_.latency_ms);
        num("latency_jitter_ms", faults_.latency_jitter_ms);
        num("stall_ms", faults_.stall_ms);
        num("stall_count", faults_.stall_count);
        num("fail_after_create", faults_.fail_after_create);
        num("drop_after_create", faults_.drop_after_create);
        num("rate_limit", faults_.rate_limit);
        num("in_use", faults_.in_use);
        if (auto v = p.find("fault_path"); v != p.end()) faults_.fault_path = v->second;
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/limits" && req.method == "POST") {
        limits l = limiter_.get();
        auto real = [&](const char* k, double& field) {
            if (auto v = p.find(k); v != p.end()) field = std::strtod(v->second.c_str(), nullptr);
        };
        real("global_rps", l.global_rps);
        real("endpoint_rps", l.endpoint_rps);
        real("burst_s", l.burst_s);
        real("refill_s", l.refill_s);
        num("max_concurrent", l.max_concurrent);
        set_limits(l);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/stats") {
        json_obj hits;
        for (const auto& [k, n] : fault_hits_) hits.num(k, n);
        co_return json_response(
            200, json_obj()
                     .num("requests", static_cast<std::int64_t>(requests_))
                     .num("rate_limited", static_cast<std::int64_t>(limiter_.rate_limited()))
                     .num("concurrency_limited", static_cast<std::int64_t>(limiter_.too_concurrent()))
                     .num("max_concurrent", max_active_)
                     .num("charges", static_cast<std::int64_t>(charges_.size()))
                     .num("intents", static_cast<std::int64_t>(intents_.size()))
                     .raw("fault_hits", hits.done())
                     .done());
    }
    if (path == "/_admin/clock" && req.method == "POST") {
        if (auto v = to_int(param(p, "advance_s"))) advance_clock(std::chrono::seconds(*v));
        co_return json_response(200, json_obj().num("now", now()).done());
    }
    if (path == "/_admin/accounts" && req.method == "POST") {
        std::vector<std::string> customers;
        const auto list = param(p, "customers");
        for (std::size_t pos = 0; pos < list.size();) {
            auto comma = std::min(list.find(',', pos), list.size());
            if (comma > pos) customers.push_back(list.substr(pos, comma - pos));
            pos = comma + 1;
        }
        if (!well_formed_account(param(p, "account")))
            co_return error_response(400, "invalid_request_error", "", "account must look like acct_…");
        add_account(param(p, "account"), customers);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/declines" && req.method == "POST") {
        if (param(p, "clear") == "true") {
            clear_decline(param(p, "customer"));
            co_return json_response(200, "{}");
        }
        decline_rule rule;
        if (p.count("code")) rule.code = param(p, "code");
        if (p.count("decline_code")) rule.decline_code = param(p, "decline_code");
        decline(param(p, "customer"), rule);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/webhooks" && req.method == "POST") {
        auto e = webhooks_->endpoint();
        auto split = [](const std::string& v) {
            std::vector<std::string> out;
            std::size_t pos = 0;
            while (pos <= v.size()) {
                auto c = v.find(',', pos);
                auto item = v.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
                if (!item.empty()) out.push_back(item);
                if (c == std::string::npos) break;
                pos = c + 1;
            }
            return out;
        };
        if (p.count("url")) e.url = param(p, "url");
        if (p.count("secrets")) e.secrets = split(param(p, "secrets"));
        if (p.count("enabled_events")) e.enabled_events = split(param(p, "enabled_events"));
        if (p.count("ca_file")) e.ca_file = param(p, "ca_file");
        if (p.count("api_version")) e.api_version = param(p, "api_version");
        num("retry_base_ms", e.retry_base_ms);
        num("retry_max_ms", e.retry_max_ms);
        num("max_attempts", e.max_attempts);
        num("timeout_ms", e.timeout_ms);
        webhooks_->configure(std::move(e));
        auto& f = webhooks_->faults();
        num("delay_ms", f.delay_ms);
        num("duplicate", f.duplicate);
        num("reorder", f.reorder);
        num("duplicate_pct", f.duplicate_pct);
        num("reorder_pct", f.reorder_pct);
        num("reorder_hold_ms", f.reorder_hold_ms);
        num("sign_skew_s", f.sign_skew_s);
        co_return json_response(200, "{}");
    }
    auto stats_json = [this] {
        auto st = webhooks_->stats();
        auto n = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
        return json_obj()
            .num("events", n(st.events))
            .num("attempts", n(st.attempts))
            .num("acked", n(st.acked))
            .num("acked_events", n(st.acked_events))
            .num("failed", n(st.failed))
            .num("duplicates", n(st.duplicates))
            .num("reordered", n(st.reordered))
            .num("given_up", n(st.given_up))
            .num("outstanding", n(st.outstanding))
            .num("pending_settlements", pending_settle_)
            .done();
    };
    if (path == "/_admin/webhooks/deliveries") {
        bool full = http::query_param(req.query(), "full").value_or("") == "1";
        std::string data = "[";
        const auto& ds = webhooks_->deliveries();
        for (std::size_t i = 0; i < ds.size(); ++i) {
            const auto& d = ds[i];
            json_obj o;
            o.str("event", d.event_id)
                .str("type", d.type)
                .num("attempt", d.attempt)
                .num("status", d.status)
                .str_or_null("error", d.error)
                .boolean("duplicate", d.duplicate)
                .boolean("reordered", d.reordered);
            if (full) o.str("signature", d.signature).str("body", d.body);
            data += (i ? "," : "") + o.done();
        }
        co_return json_response(200, json_obj().raw("data", data + "]").raw("stats", stats_json()).done());
    }
    if (path == "/_admin/webhooks/wait") {
        // Awaits acked_events ≥ N, and/or idle=1 (nothing outstanding and no settlement pending).
        int acked = qint(req, "acked_events", -1), events = qint(req, "events", -1);
        bool idle = http::query_param(req.query(), "idle").value_or("") == "1";
        int timeout_ms = std::clamp(qint(req, "timeout_ms", 10000), 0, 600000);
        bool ok = co_await webhooks_->wait(
            [&] {
                auto st = webhooks_->stats();
                if (acked >= 0 && st.acked_events < static_cast<std::uint64_t>(acked)) return false;
                if (events >= 0 && events_.size() < static_cast<std::size_t>(events)) return false;
                if (idle && (!webhooks_->idle() || pending_settle_ > 0)) return false;
                return true;
            },
            std::chrono::milliseconds(timeout_ms));
        co_return json_response(ok ? 200 : 408, stats_json());
    }
    if (path == "/_admin/events") {
        std::string data = "[";
        for (std::size_t i = 0; i < events_.size(); ++i)
            data += (i ? "," : "") + json_obj()
                                         .str("id", events_[i].id)
                                         .str("type", events_[i].type)
                                         .str("object", events_[i].object_id)
                                         .done();
        co_return json_response(200, json_obj().raw("data", data + "]").done());
    }
    if (path == "/_admin/async" && req.method == "POST") {
        int ms = static_cast<int>(settle_after_.count());
        num("settle_after_ms", ms);
        settle_after(std::chrono::milliseconds(ms));
        co_return json_response(200, json_obj().num("settle_after_ms", ms).done());
    }
    if (path == "/_admin/bank" && req.method == "POST") {
        bank_outcome(param(p, "customer"), param(p, "outcome"), param(p, "failure_code"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/settle" && req.method == "POST" && p.count("charge")) {
        if (!settle_charge(param(p, "charge"), param(p, "outcome"), param(p, "failure_code")))
            co_return json_response(409, R"({"error":"no such Charges-API debit pending"})");
        co_return json_response(200, charge_json(*find_charge(param(p, "charge"))));
    }
    if (path == "/_admin/payment_methods/attach" && req.method == "POST") {
        auto id = attach_payment_method(param(p, "customer"), param(p, "account"));
        co_return json_response(200, json_obj().str("id", id).done());
    }
    if (path == "/_admin/customers/default" && req.method == "POST") {
        set_default_payment_method(param(p, "customer"), param(p, "payment_method"), param(p, "account"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/customers" && req.method == "POST") {
        default_source(param(p, "customer"), param(p, "default_source"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/settle" && req.method == "POST") {
        bool ok = settle(param(p, "payment_intent"), param(p, "outcome"), param(p, "failure_code"));
        if (!ok) co_return json_response(409, R"({"error":"no such payment intent processing"})");
        co_return json_response(
            200, intent_json(*find_intent(param(p, "payment_intent")), default_api_version_, charges_));
    }
    if (path == "/_admin/disputes" && req.method == "POST") {
        auto id = open_dispute(param(p, "charge"), p.count("reason") ? param(p, "reason") : "fraudulent",
                               to_int(param(p, "amount")).value_or(0), param(p, "inquiry") == "true");
        if (id.empty())
            co_return json_response(409, R"({"error":"charge missing, not succeeded or disputed"})");
        co_return json_response(200, dispute_json(disputes_.back()));
    }
    if (path == "/_admin/disputes/close" && req.method == "POST") {
        if (!close_dispute(param(p, "dispute"), param(p, "status")))
            co_return json_response(
                409, R"({"error":"no such open dispute, or status not won|lost|warning_closed"})");
        for (const auto& d : disputes_)
            if (d.id == param(p, "dispute")) co_return json_response(200, dispute_json(d));
    }
    if (path == "/_admin/disputes/update" && req.method == "POST") {
        if (!update_dispute(param(p, "dispute"), param(p, "status")))
            co_return json_response(409, R"({"error":"no such open dispute, or not a step Stripe takes"})");
        for (const auto& d : disputes_)
            if (d.id == param(p, "dispute")) co_return json_response(200, dispute_json(d));
    }
    if (path == "/_admin/reset" && req.method == "POST") {
        reset();
        co_return json_response(200, "{}");
    }
    co_return http::make_response(404, "unknown admin endpoint\n");
}

}  // namespace cg::fake
