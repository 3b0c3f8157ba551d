// The pure edges of the billing pipeline (docs/design.md §4): what a delivery comes to (verdict), how a
// Stripe outcome maps onto the ledger, the requeue backoff, and the Stripe request a billing event becomes.
// No I/O: table-tested in tests/unit/billing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "billing/machine/event.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"
#include "stripe/types.hpp"

namespace cg::billing {

// Why a delivery ended as it did: the metrics label and the log field.
enum class verdict_reason {
    charged,                      // charged now, or found charged at Stripe during recovery
    declined,                     // final decline (now or found during recovery)
    cap_blocked,                  // the vault proxy refused: spend cap exceeded (an alert)
    duplicate_prevented,          // the ledger already holds a final state for this key
    dead_lettered,                // invalid payload, payload conflict, Stripe idempotency error or rejection
    requeued_lease_held,          // another worker is charging this row
    requeued_retry_same_key,      // Stripe: nothing happened (409 in use, 429, not sent); same key later
    requeued_indeterminate,       // Stripe: may have happened (5xx, timeout after sending); search later
    requeued_postgres,            // PostgreSQL failed at some step
    requeued_stripe_unavailable,  // the charge search failed
    requeued_lease_lost,          // our lease was taken over before Stripe was called
    processing,                   // Stripe answered processing: the row waits for the bank's answer; FIN
    refunded,                     // a correction's refunds made (or found made at Stripe); FIN
    correction_noop,              // a correction with nothing to do: superseded, nothing to move, …; FIN
    requeued_waiting,             // a correction waits for its predecessor (or the original charge)
    needs_authentication,         // declined until retried: the customer must authenticate the payment
};
inline constexpr std::size_t verdict_reason_count = 16;
std::string_view to_string(verdict_reason r) noexcept;

struct verdict {
    enum class action { finish, requeue };
    action act = action::finish;
    std::chrono::milliseconds delay{0};  // REQ only
    verdict_reason reason = verdict_reason::duplicate_prevented;
    std::string detail;  // one line for logs (a dead letter's reason, Stripe's message, a pg error)

    static verdict finish(verdict_reason r, std::string detail = {}) {
        return {action::finish, {}, r, std::move(detail)};
    }
    static verdict requeue(verdict_reason r, std::chrono::milliseconds d, std::string detail = {}) {
        return {action::requeue, d, r, std::move(detail)};
    }
    bool finished() const noexcept { return act == action::finish; }
};

// Requeue delay growing with the delivery's attempt count: initial · 2^(attempts−1), capped at max.
struct backoff {
    std::chrono::milliseconds initial{1'000};
    std::chrono::milliseconds max{60'000};
};
std::chrono::milliseconds backoff_delay(const backoff& b, std::int32_t attempts) noexcept;

// What the ledger does with one create-charge outcome (after the client's own bounded retries).
enum class charge_step {
    mark_charged,                // succeeded → charged + FIN
    mark_declined,               // declined → declined + FIN
    mark_cap_blocked,            // cap_exceeded → cap_blocked + dead letter + FIN + alert
    mark_conflict_dead_letter,   // idempotency_conflict → conflict + dead letter + FIN
    release_requeue,             // retry_same_key → stays pending, lease released, REQ
    mark_indeterminate_requeue,  // indeterminate → indeterminate_since, lease released, REQ
    mark_failed_dead_letter,     // rejected → failed with last_error + dead letter + FIN
    setup_requeue,               // setup_error → stays pending, lease released, REQ + alert
    mark_processing,  // succeeded but in flight (processing, requires_capture) → processing + FIN
};
charge_step step_for(stripe::outcome_class c) noexcept;
// The step for a whole outcome: a success whose payment is still in flight is mark_processing.
charge_step step_for(const stripe::charge_outcome& out) noexcept;
std::string_view to_string(charge_step s) noexcept;

// A decline that only the customer can lift by authenticating (3-D Secure and the like): Stripe's 402
// authentication_required on an off-session confirmation, or an intent left requires_action by an on-session
// one. The row is declined like any decline; the verdict, its metric and its log line tell it apart, because
// the way out is the customer's authentication and then a retry of the key, not a new card.
// The one rule, over what Stripe said: the error code of the attempt (a create's 402, or an intent's
// last_payment_error) and, when there is one, the intent's fact. The create's answer and the recovery
// search's find both ask here.
bool needs_authentication(std::string_view error_code, const stripe::fact* intent) noexcept;
bool needs_authentication(const stripe::charge_outcome& out) noexcept;

// POST /v1/charges for an event: Idempotency-Key = stripe_idempotency_key(base, generation); metadata always
// carries the base key (so a search finds a charge of any generation), customer_id and billing_period.
stripe::charge_request build_charge_request(const billing_event& ev, std::string_view base,
                                            std::int32_t generation);

// POST /v1/payment_intents (confirm=true, off_session as the event says) for an event with a
// payment_method; key and metadata as for a charge.
stripe::payment_intent_request build_intent_request(const billing_event& ev, std::string_view base,
                                                    std::int32_t generation);

// The creating call an event becomes: a PaymentIntent when it names a payment_method, else a charge.
using create_request = std::variant<stripe::charge_request, stripe::payment_intent_request>;
create_request build_request(const billing_event& ev, std::string_view base, std::int32_t generation);

}  // namespace cg::billing
