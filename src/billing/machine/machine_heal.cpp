// The decisions the healers (sweeper, poller, backfill) and the operator commands (dead-letter replay,
// retry-declined, reconcile) run instead of reading states themselves (machine.hpp).
#include <string_view>

#include "billing/machine/machine.hpp"
#include "stripe/fact.hpp"

namespace cg::billing::machine {

namespace {

// The table has a transition of a charge from `s` back to pending by `by`.
bool reopened_by(input by, record_status s) noexcept {
    for (const auto& t : transitions())
        if (t.on == table::charge && t.by == by && t.from == to_string(s) && t.to == "pending") return true;
    return false;
}

}  // namespace

std::string_view to_string(replay_command c) noexcept {
    switch (c) {
        case replay_command::publish:
            return "publish";
        case replay_command::reopen_then_publish:
            return "reopen_then_publish";
        case replay_command::refuse_superseded:
            return "refuse_superseded";
        case replay_command::refuse_declined:
            return "refuse_declined";
        case replay_command::refuse_conflict:
            return "refuse_conflict";
    }
    return "?";
}

replay_command on_replay(record_status s) noexcept {
    // The states a replay reopens are the table's replay transitions back to pending.
    if (reopened_by(input::replay, s)) return replay_command::reopen_then_publish;
    switch (s) {
        case record_status::pending:
            return replay_command::publish;
        case record_status::charged:
        case record_status::processing:
            return replay_command::refuse_superseded;
        case record_status::declined:
            return replay_command::refuse_declined;
        default:
            return replay_command::refuse_conflict;
    }
}

std::string_view to_string(retry_command c) noexcept {
    switch (c) {
        case retry_command::reopen:
            return "reopen";
        case retry_command::follow_pending:
            return "follow_pending";
        case retry_command::already_charged:
            return "already_charged";
        case retry_command::not_declined:
            return "not_declined";
    }
    return "?";
}

retry_command on_retry_declined(record_status s) noexcept {
    if (reopened_by(input::retry_declined, s)) return retry_command::reopen;
    switch (s) {
        case record_status::pending:
            return retry_command::follow_pending;
        case record_status::charged:
            return retry_command::already_charged;
        default:
            return retry_command::not_declined;
    }
}

bool awaits_payment_fact(record_status s) noexcept {
    return s == record_status::processing;
}

bool records_found_payment(record_status s) noexcept {
    return s == record_status::pending || awaits_payment_fact(s);
}

std::string_view to_string(backfill_command c) noexcept {
    switch (c) {
        case backfill_command::none:
            return "none";
        case backfill_command::insert_charged:
            return "insert_charged";
        case backfill_command::insert_processing:
            return "insert_processing";
        case backfill_command::insert_processing_then_fail:
            return "insert_processing_then_fail";
    }
    return "?";
}

backfill_command on_backfill(const stripe::fact& f, bool follow_in_flight) noexcept {
    if (f.moved == stripe::movement::charged) return backfill_command::insert_charged;
    // Only a bank debit has a processing state to wait in; a card's failure moved nothing to record.
    if (!follow_in_flight || !f.bank_debit) return backfill_command::none;
    if (f.moved == stripe::movement::in_flight) return backfill_command::insert_processing;
    if (f.moved == stripe::movement::failed) return backfill_command::insert_processing_then_fail;
    return backfill_command::none;
}

std::string_view to_string(reconcile_command c) noexcept {
    switch (c) {
        case reconcile_command::leave:
            return "leave";
        case reconcile_command::mark_charged:
            return "mark_charged";
        case reconcile_command::mark_declined:
            return "mark_declined";
    }
    return "?";
}

reconcile_command on_reconcile_found(found_command c) noexcept {
    switch (c) {
        case found_command::mark_charged:
            return reconcile_command::mark_charged;
        case found_command::mark_declined:
            return reconcile_command::mark_declined;
        case found_command::mark_processing:
        case found_command::still_open:
        case found_command::none:
            return reconcile_command::leave;
    }
    return reconcile_command::leave;
}

bool names_refund(fact_kind k) noexcept {
    return k == fact_kind::refunded || k == fact_kind::refund_update;
}

bool states_payment_status(fact_kind k) noexcept {
    return k != fact_kind::dispute_opened && k != fact_kind::dispute_closed &&
           k != fact_kind::refund_update && k != fact_kind::unknown_type;
}

}  // namespace cg::billing::machine
