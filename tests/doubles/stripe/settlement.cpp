// fake-stripe's later steps of a payment: bank debits that settle, refunds (POST /v1/refunds and their end),
// and the dispute lifecycle.

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator for large
// coroutines (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "http/proto/message.hpp"
#include "net/timeout.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"
#include "tests/doubles/stripe/params.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake {

using namespace stripe_impl;

void fake_stripe::bank_outcome(std::string customer, std::string outcome, std::string failure_code) {
    bank_outcomes_[std::move(customer)] = {std::move(outcome), std::move(failure_code)};
}

void fake_stripe::settle_later(const std::string& id, settle_step step) {
    ++pending_settle_;
    auto body = [](fake_stripe* self, std::shared_ptr<bool> alive, std::uint64_t gen, std::string id,
                   std::chrono::milliseconds after, settle_step step) -> asio::awaitable<void> {
        co_await net::sleep_for(after);
        if (!*alive || gen != self->settle_gen_) co_return;
        --self->pending_settle_;
        step(*self, id);
        self->webhooks_->notify();
    };
    asio::co_spawn(ex_, body(this, alive_, settle_gen_, id, settle_after_, step), asio::detached);
}

void fake_stripe::schedule_settlement(const std::string& intent_id) {
    settle_later(intent_id, [](fake_stripe& self, const std::string& id) {
        auto* pi = self.find_intent(id);
        if (pi && pi->status == "processing") self.settle(id, pi->settles_to, pi->settle_failure_code);
    });
}

void fake_stripe::schedule_charge_settlement(const std::string& charge_id) {
    settle_later(charge_id, [](fake_stripe& self, const std::string& id) {
        auto* c = self.find_charge(id);
        if (c && c->status == "pending") self.settle_charge(id, c->settles_to, c->settle_failure_code);
    });
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

}  // namespace cg::fake
