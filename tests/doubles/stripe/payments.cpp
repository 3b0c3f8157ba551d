// fake-stripe's charges and PaymentIntents: create, confirm, cancel, the events they make, and the
// PaymentMethod and customer steps a test makes in the customer's place.
#include <algorithm>

#include "http/proto/message.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"
#include "tests/doubles/stripe/params.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake {

using namespace stripe_impl;

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

}  // namespace cg::fake
