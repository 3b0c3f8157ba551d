#include "stripe/fact.hpp"

#include <array>

namespace cg::stripe {

namespace {

struct status_reading {
    std::string_view status;
    movement moved;
    std::string_view reason;
};

// Charge statuses (API 2024-06-20: succeeded, pending, failed).
constexpr std::array charge_statuses{
    status_reading{"succeeded", movement::charged, "the charge succeeded: the money moved"},
    status_reading{"pending", movement::in_flight,
                   "a charge pending (a bank debit, some wallets) succeeds or fails without anyone acting"},
    status_reading{"failed", movement::failed, "the charge failed: nothing moved, and nothing will under it"},
};

// PaymentIntent statuses (API 2024-06-20).
constexpr std::array intent_statuses{
    status_reading{"succeeded", movement::charged, "the intent succeeded: its latest_charge holds the money"},
    status_reading{"processing", movement::in_flight,
                   "processing (a bank debit the bank has not answered): it succeeds or fails later"},
    status_reading{"requires_capture", movement::authorised,
                   "an authorisation: held, not moved; chargeguard never asks for manual capture"},
    status_reading{"requires_payment_method", movement::failed,
                   "the attempt was declined (or a debit failed after processing): nothing moved; only a "
                   "new payment method and a new confirm can move money"},
    status_reading{"requires_action", movement::needs_customer,
                   "the customer must act (3-D Secure): nothing moved; it moves if they complete it"},
    status_reading{"requires_confirmation", movement::not_tried,
                   "created, never confirmed: Stripe has not tried the payment method"},
    status_reading{"canceled", movement::canceled, "canceled: nothing moved and nothing can"},
};

// Refund statuses (API 2024-06-20).
constexpr std::array refund_statuses{
    status_reading{"pending", movement::refund_pending, "the refund is on its way back"},
    status_reading{"requires_action", movement::refund_pending,
                   "the customer must give details (a bank refund): the money has not gone back yet"},
    status_reading{"succeeded", movement::refunded,
                   "the refund went back; Stripe may still report it failed (a closed account)"},
    status_reading{"failed", movement::refund_undone, "the refund failed: the money stays with the charge"},
    status_reading{"canceled", movement::refund_undone,
                   "the refund was canceled: the money stays with the charge"},
};

// Dispute statuses (API 2024-06-20), in the order a dispute can pass them (dispute_order reads it).
constexpr std::array dispute_statuses{
    status_reading{"warning_needs_response", movement::inquiry, "an inquiry: no funds withdrawn yet"},
    status_reading{"warning_under_review", movement::inquiry,
                   "an inquiry under review: no funds withdrawn yet"},
    status_reading{"warning_closed", movement::inquiry_closed, "the inquiry closed without a dispute"},
    status_reading{"needs_response", movement::disputed,
                   "a dispute: the funds are withdrawn until it is decided"},
    status_reading{"under_review", movement::disputed, "a dispute under review: the funds are withdrawn"},
    status_reading{"won", movement::dispute_won, "the dispute was won: the funds came back"},
    status_reading{"lost", movement::dispute_lost, "the dispute was lost: the funds are gone"},
};

template <std::size_t N>
const status_reading* find(const std::array<status_reading, N>& table, std::string_view status) noexcept {
    for (const auto& r : table)
        if (r.status == status) return &r;
    return nullptr;
}

template <std::size_t N>
movement movement_in(const std::array<status_reading, N>& table, std::string_view status) noexcept {
    const auto* r = find(table, status);
    return r ? r->moved : movement::unknown;
}

template <std::size_t N>
std::string reason_in(const std::array<status_reading, N>& table, std::string_view object,
                      std::string_view status) {
    const auto* r = find(table, status);
    if (r) return std::string(r->reason);
    return std::string(object) + " status \"" + std::string(status) +
           "\" is not one API 2024-06-20 defines: read as unknown";
}

// payment_method_details.type values whose charges are pending until a bank answers (Stripe's delayed
// notification debits). ach_debit is an ACH debit made through /v1/charges with a bank account source.
constexpr std::array<std::string_view, 7> bank_debit_types{
    "ach_debit",  "us_bank_account", "sepa_debit",      "bacs_debit",
    "acss_debit", "au_becs_debit",   "nz_bank_account",
};

}  // namespace

std::string_view to_string(movement m) noexcept {
    switch (m) {
        case movement::charged:
            return "charged";
        case movement::in_flight:
            return "in_flight";
        case movement::authorised:
            return "authorised";
        case movement::failed:
            return "failed";
        case movement::needs_customer:
            return "needs_customer";
        case movement::not_tried:
            return "not_tried";
        case movement::canceled:
            return "canceled";
        case movement::refund_pending:
            return "refund_pending";
        case movement::refunded:
            return "refunded";
        case movement::refund_undone:
            return "refund_undone";
        case movement::inquiry:
            return "inquiry";
        case movement::inquiry_closed:
            return "inquiry_closed";
        case movement::disputed:
            return "disputed";
        case movement::dispute_won:
            return "dispute_won";
        case movement::dispute_lost:
            return "dispute_lost";
        case movement::unknown:
            return "unknown";
    }
    return "?";
}

std::string_view to_string(object_kind k) noexcept {
    switch (k) {
        case object_kind::charge:
            return "charge";
        case object_kind::payment_intent:
            return "payment_intent";
        case object_kind::refund:
            return "refund";
        case object_kind::dispute:
            return "dispute";
    }
    return "?";
}

movement charge_movement(std::string_view status) noexcept {
    return movement_in(charge_statuses, status);
}
movement intent_movement(std::string_view status) noexcept {
    return movement_in(intent_statuses, status);
}
movement refund_movement(std::string_view status) noexcept {
    return movement_in(refund_statuses, status);
}
movement dispute_movement(std::string_view status) noexcept {
    return movement_in(dispute_statuses, status);
}

int dispute_order(std::string_view status) noexcept {
    if (status.empty()) return 0;
    for (std::size_t i = 0; i < dispute_statuses.size(); ++i)
        if (dispute_statuses[i].status == status) return static_cast<int>(i) + 2;
    return 1;
}

bool final_movement(object_kind k, movement m) noexcept {
    switch (m) {
        case movement::charged:
            // A succeeded charge or intent never goes back: refunds and disputes are objects of their own.
            return k == object_kind::charge || k == object_kind::payment_intent;
        case movement::failed:
            // A failed charge is final; an intent back to requires_payment_method can be confirmed again.
            return k == object_kind::charge;
        case movement::canceled:
        case movement::refund_undone:
        case movement::inquiry_closed:
        case movement::dispute_won:
        case movement::dispute_lost:
            return true;
        default:
            return false;
    }
}

bool bank_debit_type(std::string_view payment_method_type) noexcept {
    for (auto t : bank_debit_types)
        if (t == payment_method_type) return true;
    return false;
}

bool bank_debit(std::string_view payment_method_type) noexcept {
    return bank_debit_type(payment_method_type);
}

bool intent_succeeded(std::string_view status) noexcept {
    return intent_movement(status) == movement::charged;
}
bool intent_in_flight(std::string_view status) noexcept {
    auto m = intent_movement(status);
    return m == movement::in_flight || m == movement::authorised;
}
bool charge_in_flight(std::string_view status) noexcept {
    return charge_movement(status) == movement::in_flight;
}
bool refund_undone(std::string_view status) noexcept {
    return refund_movement(status) == movement::refund_undone;
}

namespace {

// What every reading fills the same way: the object, its movement and whether that is final, its ids,
// account, amount and status, and the reason its status table gives.
template <std::size_t N>
fact common_fact(object_kind kind, movement moved, std::string_view id, std::string_view charge_id,
                 std::string_view payment_intent_id, std::string_view account, std::int64_t amount,
                 std::string_view currency, std::string_view status,
                 const std::array<status_reading, N>& table, std::string_view table_name) {
    fact f;
    f.object = kind;
    f.moved = moved;
    f.final = final_movement(kind, moved);
    f.id = std::string(id);
    f.charge_id = std::string(charge_id);
    f.payment_intent_id = std::string(payment_intent_id);
    f.account = std::string(account);
    f.amount = amount;
    f.currency = std::string(currency);
    f.status = std::string(status);
    f.reason = reason_in(table, table_name, status);
    return f;
}

// A bank debit's failure is a failure after processing; the error Stripe gave is appended to the reason.
void note_payment(fact& f, std::string_view payment_method_type, std::string_view error_code) {
    f.bank_debit = bank_debit_type(payment_method_type);
    if (f.bank_debit && f.moved == movement::failed)
        f.reason = "a " + std::string(payment_method_type) + " debit failed: it failed after processing";
    if (!error_code.empty()) f.reason += " (" + std::string(error_code) + ")";
}

}  // namespace

fact read(const charge& c, std::string_view account) {
    auto f = common_fact(object_kind::charge, charge_movement(c.status), c.id, c.id, c.payment_intent,
                         account, c.amount, c.currency, c.status, charge_statuses, "charge");
    note_payment(f, c.payment_method_type, c.failure_code);
    return f;
}

fact read(const payment_intent& p, std::string_view account) {
    auto f = common_fact(object_kind::payment_intent, intent_movement(p.status), p.id, p.latest_charge, p.id,
                         account, p.amount, p.currency, p.status, intent_statuses, "payment_intent");
    note_payment(f, p.payment_method_type, p.last_error_code);
    return f;
}

fact read(const refund& r, std::string_view account) {
    return common_fact(object_kind::refund, refund_movement(r.status), r.id, r.charge, r.payment_intent,
                       account, r.amount, r.currency, r.status, refund_statuses, "refund");
}

fact read(const dispute& d, std::string_view account) {
    return common_fact(object_kind::dispute, dispute_movement(d.status), d.id, d.charge, d.payment_intent,
                       account, d.amount, d.currency, d.status, dispute_statuses, "dispute");
}

}  // namespace cg::stripe
