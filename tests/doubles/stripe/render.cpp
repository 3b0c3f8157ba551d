// How fake-stripe renders its objects (charges, PaymentIntents, refunds, disputes, PaymentMethods,
// customers) and Stripe's error bodies (render.hpp).
#include "tests/doubles/stripe/render.hpp"

#include <cstdio>

#include "http/proto/message.hpp"

namespace cg::fake::stripe_impl {
namespace {

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

}  // namespace

std::string meta_json(const std::vector<std::pair<std::string, std::string>>& m) {
    json_obj o;
    for (const auto& [k, v] : m) o.str(k, v);
    return o.done();
}

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
                       std::string_view param, std::string_view extra_fields) {
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
                              std::string_view message, std::string_view param) {
    return json_response(status, error_body(type, code, message, param));
}

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

}  // namespace cg::fake::stripe_impl
