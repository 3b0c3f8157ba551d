#include "billing/machine/outcome.hpp"

#include <algorithm>

#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "net/backoff.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {

std::string_view to_string(verdict_reason r) noexcept {
    switch (r) {
        case verdict_reason::charged:
            return "charged";
        case verdict_reason::declined:
            return "declined";
        case verdict_reason::cap_blocked:
            return "cap_blocked";
        case verdict_reason::duplicate_prevented:
            return "duplicate_prevented";
        case verdict_reason::dead_lettered:
            return "dead_lettered";
        case verdict_reason::requeued_lease_held:
            return "requeued_lease_held";
        case verdict_reason::requeued_retry_same_key:
            return "requeued_retry_same_key";
        case verdict_reason::requeued_indeterminate:
            return "requeued_indeterminate";
        case verdict_reason::requeued_postgres:
            return "requeued_postgres";
        case verdict_reason::requeued_stripe_unavailable:
            return "requeued_stripe_unavailable";
        case verdict_reason::requeued_lease_lost:
            return "requeued_lease_lost";
        case verdict_reason::processing:
            return "processing";
        case verdict_reason::refunded:
            return "refunded";
        case verdict_reason::correction_noop:
            return "correction_noop";
        case verdict_reason::requeued_waiting:
            return "requeued_waiting";
        case verdict_reason::needs_authentication:
            return "needs_authentication";
    }
    return "?";
}

std::chrono::milliseconds backoff_delay(const backoff& b, std::int32_t attempts) noexcept {
    // At least 1 ms to double from; NSQ's attempt counts start at 1.
    auto first = std::max(b.initial, std::chrono::milliseconds(1));
    return net::backoff_delay({first, b.max, net::jitter::none},
                              static_cast<std::uint64_t>(std::max(attempts, 1)));
}

bool needs_authentication(std::string_view error_code, const stripe::fact* intent) noexcept {
    return error_code == "authentication_required" ||
           (intent && intent->moved == stripe::movement::needs_customer);
}

bool needs_authentication(const stripe::charge_outcome& out) noexcept {
    if (!out.intent) return needs_authentication(out.error.code, nullptr);
    const auto fact = stripe::read(*out.intent);
    return needs_authentication(out.error.code, &fact);
}

charge_step step_for(stripe::outcome_class c) noexcept {
    using oc = stripe::outcome_class;
    switch (c) {
        case oc::succeeded:
            return charge_step::mark_charged;
        case oc::declined:
            return charge_step::mark_declined;
        case oc::cap_exceeded:
            return charge_step::mark_cap_blocked;
        case oc::idempotency_conflict:
            return charge_step::mark_conflict_dead_letter;
        case oc::retry_same_key:
            return charge_step::release_requeue;
        case oc::indeterminate:
            return charge_step::mark_indeterminate_requeue;
        case oc::rejected:
            return charge_step::mark_failed_dead_letter;
        case oc::setup_error:
            return charge_step::setup_requeue;
    }
    // An outcome class added later must not be mistaken for a final answer: treat it as "may have happened".
    return charge_step::mark_indeterminate_requeue;
}

charge_step step_for(const stripe::charge_outcome& out) noexcept {
    auto s = step_for(out.cls);
    if (s == charge_step::mark_charged && !out.in_flight_status.empty()) return charge_step::mark_processing;
    return s;
}

std::string_view to_string(charge_step s) noexcept {
    switch (s) {
        case charge_step::mark_charged:
            return "mark_charged";
        case charge_step::mark_declined:
            return "mark_declined";
        case charge_step::mark_cap_blocked:
            return "mark_cap_blocked";
        case charge_step::mark_conflict_dead_letter:
            return "mark_conflict_dead_letter";
        case charge_step::release_requeue:
            return "release_requeue";
        case charge_step::mark_indeterminate_requeue:
            return "mark_indeterminate_requeue";
        case charge_step::mark_failed_dead_letter:
            return "mark_failed_dead_letter";
        case charge_step::setup_requeue:
            return "setup_requeue";
        case charge_step::mark_processing:
            return "mark_processing";
    }
    return "?";
}

namespace {

// The fields both creating requests share.
template <typename Request>
Request common_request(const billing_event& ev, std::string_view base, std::int32_t generation) {
    Request r;
    r.amount = ev.amount_cents;
    r.currency = ev.currency;
    r.customer = ev.stripe_customer_id;
    r.description = ev.description;
    r.metadata = {{"billing_key", std::string(base)},
                  {"customer_id", ev.customer_id},
                  {"billing_period", ev.billing_period}};
    r.idempotency_key = stripe_idempotency_key(base, generation);
    r.stripe_account = ev.stripe_account;
    return r;
}

}  // namespace

stripe::charge_request build_charge_request(const billing_event& ev, std::string_view base,
                                            std::int32_t generation) {
    return common_request<stripe::charge_request>(ev, base, generation);
}

stripe::payment_intent_request build_intent_request(const billing_event& ev, std::string_view base,
                                                    std::int32_t generation) {
    auto r = common_request<stripe::payment_intent_request>(ev, base, generation);
    r.payment_method = ev.payment_method;
    r.confirm = true;
    r.off_session = ev.off_session;
    return r;
}

create_request build_request(const billing_event& ev, std::string_view base, std::int32_t generation) {
    if (ev.uses_payment_intent()) return build_intent_request(ev, base, generation);
    return build_charge_request(ev, base, generation);
}

}  // namespace cg::billing
