#include "billing/machine/event.hpp"

#include <simdjson.h>

#include <algorithm>

#include "core/log.hpp"

namespace cg::billing {
namespace {

const char* describe(int v) noexcept {
    switch (static_cast<event_errc>(v)) {
        case event_errc::ok:
            return "ok";
        case event_errc::too_large:
            return "event too large";
        case event_errc::not_json:
            return "event is not a JSON object";
        case event_errc::missing_field:
            return "event lacks a required field";
        case event_errc::bad_field:
            return "event field is invalid";
    }
    return "unknown event error";
}

bool id_chars(std::string_view s, std::string_view extra) {
    return std::all_of(s.begin(), s.end(), [&](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               extra.find(c) != std::string_view::npos;
    });
}

constexpr std::int64_t max_amount = 99'999'999;
constexpr std::int64_t max_revision = 1'000'000;

result<void> validate_payment_method(const billing_event& e) {
    const auto& pm = e.payment_method;
    if (pm.empty()) return {};
    bool known_prefix = pm.starts_with("pm_") || pm.starts_with("card_") || pm.starts_with("src_");
    if (!known_prefix || pm.size() > 255 || !id_chars(pm, "_"))
        return error(event_errc::bad_field, "payment_method: must look like pm_… (or card_…, src_…)");
    return {};
}

result<void> validate_account(const billing_event& e) {
    if (!e.connected()) return {};
    if (!valid_stripe_account(e.stripe_account))
        return error(event_errc::bad_field,
                     "stripe_account: must look like acct_… ([A-Za-z0-9] after acct_)");
    return {};
}

result<void> validate(const billing_event& e) {
    auto bad = [](std::string m) { return error(event_errc::bad_field, std::move(m)); };
    if (e.customer_id.empty() || e.customer_id.size() > 255 || !id_chars(e.customer_id, "_.@-"))
        return bad("customer_id: must be 1..255 characters of [A-Za-z0-9_.@-]");
    if (e.billing_period.empty() || e.billing_period.size() > 64 || !id_chars(e.billing_period, "_.-"))
        return bad("billing_period: must be 1..64 characters of [A-Za-z0-9_.-]");
    // A correction's amount is the period's new total, which may be nothing at all (a full refund).
    if (e.amount_cents < (e.is_correction() ? 0 : 1) || e.amount_cents > max_amount)
        return bad("amount_cents: must be an integer in " + std::string(e.is_correction() ? "0" : "1") +
                   ".." + std::to_string(max_amount));
    if (e.currency.size() != 3 ||
        !std::all_of(e.currency.begin(), e.currency.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        return bad("currency: must be a three-letter ISO 4217 code");
    if (!e.stripe_customer_id.starts_with("cus_") || e.stripe_customer_id.size() > 255 ||
        !id_chars(e.stripe_customer_id, "_"))
        return bad("stripe_customer_id: must look like cus_…");
    if (e.description.size() > 500) return bad("description: at most 500 characters");
    if (auto a = validate_account(e); !a) return a;
    return validate_payment_method(e);
}

}  // namespace

bool valid_stripe_account(std::string_view s) noexcept {
    constexpr std::string_view prefix = "acct_";
    return s.starts_with(prefix) && s.size() > prefix.size() && s.size() <= prefix.size() + 250 &&
           id_chars(s.substr(prefix.size()), "");
}

const std::error_category& event_category() noexcept {
    static const simple_category cat("chargeguard.billing.event", describe);
    return cat;
}

result<billing_event> parse_event(std::string_view body) {
    if (body.size() > max_event_bytes)
        return error(event_errc::too_large,
                     std::to_string(body.size()) + " bytes, limit " + std::to_string(max_event_bytes));
    // The DOM parser validates the whole document (trailing garbage included) before we read it. One parser
    // per thread, kept: its buffers (sized for the largest event so far, at most max_event_bytes) are reused
    // instead of allocated for every message. The document is only read before this function returns.
    thread_local simdjson::dom::parser parser;
    simdjson::dom::object obj;
    if (auto err = parser.parse(body.data(), body.size()).get(obj))
        return error(event_errc::not_json,
                     std::string("expected one JSON object: ") + simdjson::error_message(err));

    billing_event e;
    bool have[5] = {};
    bool off_session_given = false;
    bool account_given = false;
    for (auto member : obj) {
        // Named, not structured bindings: clang 14 (the fuzz build) cannot capture those in a lambda.
        std::string_view key = member.key;
        simdjson::dom::element value = member.value;
        auto str = [&](std::string& out, int slot) -> result<void> {
            std::string_view v;
            if (value.get_string().get(v))
                return error(event_errc::bad_field, std::string(key) + ": must be a string");
            out.assign(v);
            if (slot >= 0) have[slot] = true;
            return {};
        };
        result<void> r;
        if (key == "customer_id") {
            r = str(e.customer_id, 0);
        } else if (key == "billing_period") {
            r = str(e.billing_period, 1);
        } else if (key == "currency") {
            r = str(e.currency, 3);
            std::transform(e.currency.begin(), e.currency.end(), e.currency.begin(), [](char c) {
                return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
            });
        } else if (key == "stripe_customer_id") {
            r = str(e.stripe_customer_id, 4);
        } else if (key == "description") {
            r = str(e.description, -1);
        } else if (key == "payment_method") {
            r = str(e.payment_method, -1);
        } else if (key == "stripe_account") {
            // Present means connected: an empty string is refused (validate), never read as the platform.
            r = str(e.stripe_account, -1);
            account_given = true;
        } else if (key == "off_session") {
            if (value.get_bool().get(e.off_session))
                return error(event_errc::bad_field, "off_session: must be true or false");
            off_session_given = true;
        } else if (key == "revision") {
            std::int64_t v = 0;
            if (!value.is_int64() || value.get_int64().get(v) || v < 0 || v > max_revision)
                return error(event_errc::bad_field,
                             "revision: must be an integer in 0.." + std::to_string(max_revision));
            e.revision = static_cast<std::int32_t>(v);
        } else if (key == "amount_cents") {
            // Integers only: 19.99 or "1999" are rejected rather than guessed at (money is never a float).
            std::int64_t v = 0;
            if (!value.is_int64() || value.get_int64().get(v))
                return error(event_errc::bad_field,
                             "amount_cents: must be an integer in 1.." + std::to_string(max_amount));
            e.amount_cents = v;
            have[2] = true;
        }
        if (!r) return r.err();
    }
    static constexpr const char* names[5] = {"customer_id", "billing_period", "amount_cents", "currency",
                                             "stripe_customer_id"};
    for (int i = 0; i < 5; ++i)
        if (!have[i]) return error(event_errc::missing_field, names[i]);
    if (account_given && e.stripe_account.empty())
        return error(event_errc::bad_field,
                     "stripe_account: must look like acct_… ([A-Za-z0-9] after acct_)");
    if (auto v = validate(e); !v) return v.err();
    if (off_session_given && !e.uses_payment_intent())
        return error(event_errc::bad_field, "off_session: only with payment_method");
    return e;
}

std::string to_json(const billing_event& e) {
    std::string out = "{\"customer_id\":";
    append_json_string(out, e.customer_id);
    out += ",\"billing_period\":";
    append_json_string(out, e.billing_period);
    out += ",\"amount_cents\":" + std::to_string(e.amount_cents) + ",\"currency\":";
    append_json_string(out, e.currency);
    out += ",\"stripe_customer_id\":";
    append_json_string(out, e.stripe_customer_id);
    if (!e.description.empty()) {
        out += ",\"description\":";
        append_json_string(out, e.description);
    }
    // off_session is refused without a payment method (parse_event).
    if (e.uses_payment_intent()) {
        out += ",\"payment_method\":";
        append_json_string(out, e.payment_method);
        out += e.off_session ? ",\"off_session\":true" : ",\"off_session\":false";
    }
    if (e.connected()) {
        out += ",\"stripe_account\":";
        append_json_string(out, e.stripe_account);
    }
    if (e.revision > 0) out += ",\"revision\":" + std::to_string(e.revision);
    out += '}';
    return out;
}

}  // namespace cg::billing
