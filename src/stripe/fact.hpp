// One reading of Stripe: any payment object as the API returns it (created, retrieved, listed, or inside an
// event) becomes one payment fact — what money moved, for which objects, whether a later status can still
// change that, and why. Every place that asks "what did this Stripe object do with the money" asks here, so
// a PaymentIntent status means the same thing to the create call, the recovery search, the backfill,
// reconcile and the vault. Pure, no I/O: table-tested in tests/unit/stripe/fact_test.cpp against every
// status the pinned API version (2024-06-20) defines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stripe/types.hpp"

namespace cg::stripe {

// What an object says about the money.
enum class movement {
    charged,         // the money moved to the account (charge or PaymentIntent succeeded)
    in_flight,       // it will move or fail without anyone acting (a pending charge, a processing intent)
    authorised,      // held on the card, not moved (requires_capture): chargeguard never asks for it
    failed,          // the attempt failed; nothing moved (a charge failed, an intent back to
                     // requires_payment_method after a decline or a failed debit)
    needs_customer,  // nothing moved; only the customer can move it (requires_action: 3-D Secure)
    not_tried,       // Stripe has not tried to move it (requires_confirmation)
    canceled,        // the intent was canceled; nothing moved, nothing will
    refund_pending,  // a refund on its way back (pending, requires_action)
    refunded,        // a refund that went back to the customer
    refund_undone,   // a refund that failed or was canceled: the money stays with the charge
    inquiry,         // a dispute still an inquiry (warning_*): no funds withdrawn yet
    inquiry_closed,  // an inquiry closed without a dispute: nothing withdrawn
    disputed,        // funds withdrawn by a dispute not yet decided (needs_response, under_review)
    dispute_won,     // the dispute was won: the funds came back
    dispute_lost,    // the dispute was lost: the funds are gone
    unknown,         // a status the pinned API version does not define: never read as money moved or not
};
std::string_view to_string(movement m) noexcept;

enum class object_kind { charge, payment_intent, refund, dispute };
std::string_view to_string(object_kind k) noexcept;

struct fact {
    object_kind object = object_kind::charge;
    movement moved = movement::unknown;
    // No later status of this object can change `moved` without someone acting again (a new confirm, a new
    // refund). A succeeded refund is not final: Stripe may still report it failed.
    bool final = false;
    // The charge (or the intent's failed attempt, by last_payment_error.payment_method.type) was a bank
    // debit: pending until the bank answers, so a failed one failed after processing, whether or not
    // chargeguard saw it pending.
    bool bank_debit = false;
    std::string id;                 // the object's own id (ch_…, pi_…, re_…, dp_…)
    std::string charge_id;          // the charge: the object itself, an intent's latest_charge, a refund's or
                                    // dispute's charge
    std::string payment_intent_id;  // the intent: the object itself or the one it belongs to
    std::string account;            // the Stripe-Account it was read in; empty: the platform
    std::int64_t amount = 0;
    std::string currency;
    std::string status;  // the object's own status, as Stripe spelled it
    std::string reason;  // why `moved` and `final` are what they are (one line)
};

// Status-level readings (for objects read as raw JSON); the object readings below use them.
movement charge_movement(std::string_view status) noexcept;
movement intent_movement(std::string_view status) noexcept;
movement refund_movement(std::string_view status) noexcept;
movement dispute_movement(std::string_view status) noexcept;
bool final_movement(object_kind k, movement m) noexcept;

// Where a dispute status stands in the order a dispute can pass them: an inquiry (warning_*) first, since an
// inquiry may escalate into a chargeback and never the other way, then the chargeback, whose end beats its
// review, and a loss beats a win. 0 for no status, 1 for one the pinned API version does not define (below
// every defined one). Two readings of the same dispute keep the later of the two.
int dispute_order(std::string_view status) noexcept;

// The payment_method_details.type values Stripe settles later (delayed notification bank debits).
bool bank_debit_type(std::string_view payment_method_type) noexcept;

// A dispute as far as the fact needs it (webhook events carry it; chargeguard never retrieves one).
struct dispute {
    std::string id;  // dp_…
    std::string charge;
    std::string payment_intent;
    std::int64_t amount = 0;
    std::string currency;
    std::string status;
};

fact read(const charge& c, std::string_view account = {});
fact read(const payment_intent& p, std::string_view account = {});
fact read(const refund& r, std::string_view account = {});
fact read(const dispute& d, std::string_view account = {});

// Money moved for good or may still: what a spend cap keeps counting and a ledger must not call a failure.
inline bool money_may_move(movement m) noexcept {
    return m == movement::charged || m == movement::in_flight || m == movement::authorised ||
           m == movement::needs_customer || m == movement::not_tried || m == movement::unknown;
}

}  // namespace cg::stripe
