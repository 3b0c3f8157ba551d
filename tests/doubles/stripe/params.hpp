// fake-stripe's private request reading (params.cpp): form parameters, the account a request acts in, and
// Stripe's checks of a POST's parameters. Not part of the double's interface (fake_stripe.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/proto/message.hpp"

namespace cg::fake::stripe_impl {

using params = std::map<std::string, std::string>;

std::optional<std::int64_t> to_int(std::string_view s);
std::vector<std::pair<std::string, std::string>> metadata_of(const params& p);
std::string param(const params& p, const std::string& k);
// The account a request acts in: its Stripe-Account header (checked by api()); empty: the platform.
std::string account_of(const http::request& req);
bool well_formed_account(std::string_view a);

// Sets the account objects and events are made in for one synchronous step, then puts the previous back.
struct account_scope {
    std::string& cur;
    std::string prev;
    account_scope(std::string& c, const std::string& now) : cur(c), prev(c) { cur = now; }
    ~account_scope() { cur = prev; }
    account_scope(const account_scope&) = delete;
    account_scope& operator=(const account_scope&) = delete;
};

// Stripe's 400 parameter_unknown for `k`.
http::response unknown_parameter(const std::string& k);
// An integer parameter within [lo, hi] (Stripe's messages for a value that is not one, or out of range).
std::optional<http::response> check_integer(std::string_view name, std::string_view value, std::int64_t lo,
                                            std::int64_t hi);
// "/v1/payment_intents/pi_…/cancel" → "pi_…"; empty for any other path.
std::string cancelled_intent_id(const std::string& path);

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

intent_methods methods_of(const params& p, std::string_view version);

// Stripe's checks of a POST to `path` in API `version`; nullopt when valid.
std::optional<http::response> validate(const std::string& path, const params& p, std::string_view version);
// What makes two POSTs under one idempotency key the same request.
std::string fingerprint(const std::string& path, const params& p);
// An integer query parameter, `dflt` when absent or not an integer.
int qint(const http::request& req, std::string_view key, int dflt);

// What a create request says of a charge or a PaymentIntent alike.
template <typename Rec>
void read_payment_params(Rec& r, const params& p) {
    r.amount = to_int(param(p, "amount")).value_or(0);
    r.currency = param(p, "currency");
    r.customer = param(p, "customer");
    r.description = param(p, "description");
    r.metadata = metadata_of(p);
}

}  // namespace cg::fake::stripe_impl
