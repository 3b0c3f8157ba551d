// fake-stripe's private rendering (render.cpp): a minimal JSON object writer, the objects as Stripe renders
// them in JSON, and Stripe's error bodies. Not part of the double's interface (fake_stripe.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "http/proto/message.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

namespace cg::fake::stripe_impl {

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

std::string meta_json(const std::vector<std::pair<std::string, std::string>>& m);

// Stripe's US bank account test payment methods (ACH Direct Debit, "Test account numbers"): the payment
// answers processing, then settles this way. `_processing` never settles by itself.
struct async_method {
    std::string_view pm, settles_to, failure_code;
};

const async_method* async_method_of(std::string_view pm);

std::string charge_json(const charge_rec& c);
std::string refund_json(const refund_rec& r);
std::string dispute_json(const dispute_rec& d);
// Stripe's failure_message for a bank debit's failure code.
std::string bank_failure_message(std::string_view code);
// "$25.00", as Stripe writes amounts in refund errors.
std::string money(std::int64_t minor, std::string_view currency);
// A PaymentIntent as API `version` renders it; `charges` are the fake's charges (an older version lists the
// intent's own, newest first).
std::string intent_json(const intent_rec& p, std::string_view version,
                        const std::vector<charge_rec>& charges);
// A card PaymentMethod attached to `customer`, as API version 2024-06-20 renders it.
std::string card_payment_method_json(const std::string& id, const std::string& customer,
                                     std::int64_t created);
// A Customer as API version 2024-06-20 renders it, with its invoice_settings.default_payment_method.
std::string customer_json(const std::string& id, const std::string& default_method, std::int64_t created);

http::response json_response(int status, std::string body);
std::string error_body(std::string_view type, std::string_view code, std::string_view message,
                       std::string_view param = {}, std::string_view extra_fields = {});
http::response error_response(int status, std::string_view type, std::string_view code,
                              std::string_view message, std::string_view param = {});

}  // namespace cg::fake::stripe_impl
