// stripe::client's creating POSTs: /v1/charges and /v1/payment_intents — their form bodies, and what a 2xx
// answer means, read through the fact (stripe/fact.hpp). The call itself (key, retries, classification,
// metrics) is stripe/client_call.hpp's.
#include <cstdint>
#include <string>
#include <utility>

#include "stripe/client.hpp"
#include "stripe/client_call.hpp"
#include "stripe/fact.hpp"
#include "stripe/form.hpp"
#include "stripe/json.hpp"

namespace cg::stripe {
namespace {

using namespace client_detail;

charge_outcome base_outcome(call_result&& r) {
    charge_outcome o;
    o.cls = r.cls;
    o.http_status = r.http.ok() ? r.http.resp.status : 0;
    o.request_id = std::move(r.request_id);
    o.replayed = r.replayed;
    o.attempts = r.attempts;
    o.message = std::move(r.message);
    if (r.error) {
        o.error = std::move(*r.error);
        o.charge_id = o.error.charge;
        o.payment_intent_id = o.error.payment_intent;
    }
    return o;
}

// A 2xx whose body we cannot read still means "done", but we do not know the object: let billing
// resolve it through the list like any other unknown.
void unreadable(charge_outcome& o, const cg::error& e) {
    o.cls = outcome_class::indeterminate;
    o.message = "HTTP " + std::to_string(o.http_status) + " with unreadable body: " + e.message;
}

form_map meta_form(const metadata& m) {
    form_map out;
    for (const auto& [k, v] : m) out.emplace_back(k, form_value(v));
    return out;
}

// The outcome of POST /v1/charges, read through the fact (stripe/fact.hpp): a 200 whose charge failed is a
// decline; a pending one is in flight; a status the pinned API version does not define says nothing certain,
// so the row is left for the search (indeterminate) rather than recorded as charged.
void read_charge(charge_outcome& o, const std::string& body) {
    auto c = parse_charge(body);
    if (!c) return unreadable(o, c.err());
    o.charge_id = c->id;
    o.payment_intent_id = c->payment_intent;
    auto f = read(*c);
    if (f.moved == movement::failed) {
        o.cls = outcome_class::declined;
        o.message = "charge " + c->id + " failed: " + c->failure_code;
    } else if (f.moved == movement::in_flight) {
        o.in_flight_status = c->status;
        o.message = "charge " + c->id + " is " + c->status;
    } else if (f.moved != movement::charged) {
        o.cls = outcome_class::indeterminate;
        o.message = "charge " + c->id + ": " + f.reason;
    }
    o.charge = std::move(*c);
}

// The outcome of a confirmed POST /v1/payment_intents, read through the fact: the charge recorded is the
// intent's latest_charge. succeeded settled; processing and requires_capture are in flight (in_flight_status:
// not a charge yet). requires_payment_method, requires_action and canceled mean the customer would have to
// act: a final decline for a billing run. requires_confirmation (Stripe never tried the payment method: the
// confirm did not run) and a status the pinned version does not define are not an answer: indeterminate, so
// the recovery search reads the intent again (where requires_confirmation is "not charged": a new key
// generation).
void read_intent(charge_outcome& o, const std::string& body) {
    auto p = parse_payment_intent(body);
    if (!p) return unreadable(o, p.err());
    o.payment_intent_id = p->id;
    o.charge_id = p->latest_charge;
    auto f = read(*p);
    switch (f.moved) {
        case movement::charged:
            break;
        case movement::in_flight:
        case movement::authorised:
            o.in_flight_status = p->status;
            o.message = "payment intent " + p->id + " is " + p->status;
            break;
        case movement::failed:
        case movement::needs_customer:
        case movement::canceled:
            o.cls = outcome_class::declined;
            o.message = "payment intent " + p->id + " is " + p->status;
            if (!p->last_error_code.empty()) o.message += ": " + p->last_error_code;
            break;
        default:
            o.cls = outcome_class::indeterminate;
            o.message = "payment intent " + p->id + " is " + p->status + ": " + f.reason;
            break;
    }
    o.intent = std::move(*p);
}

// A creating POST: the operation names the endpoint and how its 2xx body is read; everything else (key,
// retries, classification, metrics) is shared.
struct create_op {
    operation op;
    const char* path;
    void (*read_success)(charge_outcome&, const std::string&);
};
constexpr create_op charge_op{operation::create_charge, "/v1/charges", read_charge};
constexpr create_op intent_op{operation::create_payment_intent, "/v1/payment_intents", read_intent};

net::awaitable<charge_outcome> run_create(state_ptr st, create_op op, std::string form, std::string key,
                                          std::string account) {
    auto start = begin_call(*st);
    auto r =
        co_await run_call(st, op.op, "POST", op.path, std::move(form), std::move(key), std::move(account));
    std::string body = r.http.ok() ? std::move(r.http.resp.body) : std::string();
    charge_outcome o = base_outcome(std::move(r));
    if (o.cls == outcome_class::succeeded) op.read_success(o, body);
    end_call(*st, op.op, o.cls, start);
    co_return o;
}

// amount, currency, customer, then `extra`, then description and metadata (the order Stripe's SDKs use).
std::string create_form(std::int64_t amount, const std::string& currency, const std::string& customer,
                        form_map extra, const std::string& description, const metadata& md) {
    form_map f;
    f.emplace_back("amount", std::to_string(amount));
    f.emplace_back("currency", currency);
    f.emplace_back("customer", customer);
    for (auto& e : extra) f.push_back(std::move(e));
    if (!description.empty()) f.emplace_back("description", description);
    if (!md.empty()) f.emplace_back("metadata", meta_form(md));
    return encode_form(f);
}

std::string charge_form(const charge_request& req) {
    return create_form(req.amount, req.currency, req.customer, {}, req.description, req.metadata);
}

// Since API version 2023-08-16 an intent created without `payment_method_types` accepts the payment methods
// enabled in the Dashboard, redirect-based ones included, and Stripe refuses to confirm it without a
// `return_url`. A server-side confirmation has no page to return to, so it enables automatic payment methods
// with redirects never allowed: every method that can be charged without the customer present (cards and the
// bank debits: us_bank_account, sepa_debit, bacs_debit, acss_debit, au_becs_debit, link) stays accepted, on
// the pinned version and on older ones alike, and nothing that needs a redirect can be confirmed.
std::string intent_form(const payment_intent_request& req) {
    form_map extra;
    if (!req.payment_method.empty()) extra.emplace_back("payment_method", req.payment_method);
    if (req.confirm) {
        extra.emplace_back("automatic_payment_methods",
                           form_map{{"enabled", "true"}, {"allow_redirects", "never"}});
        extra.emplace_back("confirm", "true");
    }
    if (req.off_session) extra.emplace_back("off_session", "true");
    return create_form(req.amount, req.currency, req.customer, std::move(extra), req.description,
                       req.metadata);
}

}  // namespace

net::awaitable<charge_outcome> client::create_charge(charge_request req, call_turn turn) {
    if (!turn.held()) turn = co_await admit(*st_);
    std::string key = std::move(req.idempotency_key);
    co_return co_await on_strand(
        st_, run_create(st_, charge_op, charge_form(req), std::move(key), std::move(req.stripe_account)));
}

net::awaitable<charge_outcome> client::create_payment_intent(payment_intent_request req, call_turn turn) {
    if (!turn.held()) turn = co_await admit(*st_);
    std::string key = std::move(req.idempotency_key);
    co_return co_await on_strand(
        st_, run_create(st_, intent_op, intent_form(req), std::move(key), std::move(req.stripe_account)));
}

}  // namespace cg::stripe
