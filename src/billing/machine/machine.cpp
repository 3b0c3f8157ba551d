#include "billing/machine/machine.hpp"

#include <array>
#include <string>

namespace cg::billing::machine {

namespace {

using enum input;
constexpr auto charge = table::charge;
constexpr auto revision = table::revision;
constexpr auto move = table::move;

// The one table. A new statement that moves a state needs its row here (machine_test.cpp finds every such
// statement in src/billing and the migrations and checks it against this table).
constexpr std::array all_transitions{
    // A charge: billing_records.
    transition{charge, "", "pending", delivery, "ledger_sql.hpp: preflight_insert_sql",
               "the row is written, leased and its first attempt recorded before Stripe hears of it"},
    transition{charge, "", "charged", backfill, "backfill.cpp: backfill_insert_sql",
               "a succeeded charge carries a key the ledger lost (a failover): recorded as Stripe has it"},
    transition{charge, "", "processing", backfill, "backfill.cpp: backfill_in_flight_sql",
               "a bank debit in flight carries a key the ledger lost: it waits for its end as processing"},
    transition{charge, "pending", "charged", stripe_answer, "ledger_sql.hpp: settle_sql (mark_charged)",
               "Stripe moved the money and named the charge"},
    transition{charge, "pending", "declined", stripe_answer, "ledger_sql.hpp: settle_sql (mark_declined)",
               "a final decline, or an authentication only the customer can give"},
    transition{charge, "pending", "processing", stripe_answer, "ledger_sql.hpp: processing_sql",
               "Stripe accepted a payment that settles later (a bank debit)"},
    transition{charge, "pending", "cap_blocked", stripe_answer,
               "ledger_sql.hpp: settle_sql (mark_cap_blocked)",
               "the vault proxy refused: the spend cap; a dead letter keeps the event"},
    transition{charge, "pending", "conflict", stripe_answer, "ledger_sql.hpp: settle_sql (mark_conflict)",
               "Stripe's idempotency_error: the key was used with other parameters; a dead letter"},
    transition{charge, "pending", "failed", stripe_answer, "ledger_sql.hpp: settle_sql (mark_failed)",
               "Stripe rejected the request as sent; a dead letter"},
    transition{charge, "pending", "charged", search_found, "ledger_sql.hpp: settle_sql (mark_charged)",
               "the search found a payment carrying the key that moved the money"},
    transition{charge, "pending", "declined", search_found, "ledger_sql.hpp: settle_sql (mark_declined)",
               "the search found this generation's payment declined"},
    transition{charge, "pending", "processing", search_found, "ledger_sql.hpp: processing_sql",
               "the search found the payment in flight, or a bank debit that failed (after processing)"},
    transition{charge, "processing", "charged", payment_fact,
               "settlement_store.cpp: update_row_sql (apply_fact)",
               "the bank said yes: a webhook or the poll"},
    transition{charge, "processing", "failed_after_processing", payment_fact,
               "settlement_store.cpp: update_row_sql (apply_fact)",
               "the bank said no: the dead letter of the delivery is written"},
    transition{charge, "failed_after_processing", "charged", payment_fact,
               "settlement_store.cpp: update_row_sql (apply_fact)",
               "a success beats a failure report (an anomaly, alerted)"},
    transition{charge, "declined", "charged", payment_fact,
               "settlement_store.cpp: update_row_sql (apply_fact)",
               "an intent the customer completed after the decline (an anomaly, alerted)"},
    transition{charge, "declined", "charged", retry_declined, "retry_store.cpp: charged_by_intent_sql",
               "retry-declined found the declined intent succeeded after all"},
    transition{charge, "declined", "pending", retry_declined, "retry_store.cpp: reopen_declined_sql",
               "retry-declined reopens the row under a new key generation"},
    transition{charge, "failed", "pending", replay, "ledger_sql.hpp: reopen_sql",
               "the replayed dead letter charges again; the open answer is searched first"},
    transition{charge, "cap_blocked", "pending", replay, "ledger_sql.hpp: reopen_sql",
               "the replayed dead letter charges again once the cap allows it"},
    transition{charge, "failed_after_processing", "pending", replay, "ledger_sql.hpp: reopen_sql",
               "the replayed dead letter charges again under a new key generation"},
    // A correction revision: billing_corrections.
    transition{revision, "", "waiting", delivery, "0018_corrections.sql: cg_correction_admit",
               "the revision is recorded; it waits for the original charge and its predecessor"},
    transition{revision, "waiting", "pending", delivery, "0018_corrections.sql: cg_correction_admit",
               "its predecessor ended: the difference is computed, its moves written, the lease taken"},
    transition{revision, "waiting", "applied", delivery, "0018_corrections.sql: cg_correction_admit",
               "nothing to move: the period already holds the revision's total"},
    transition{revision, "waiting", "superseded", later_revision, "0018_corrections.sql: cg_correction_admit",
               "a later revision started first: this one never moves money"},
    transition{revision, "pending", "applied", moves_ended, "correction_ledger.cpp: finish_sql",
               "every move done"},
    transition{revision, "pending", "declined", moves_ended, "correction_ledger.cpp: finish_sql",
               "a move was declined"},
    transition{revision, "pending", "failed", moves_ended, "correction_ledger.cpp: finish_sql",
               "a move was refused (its dead letter written first)"},
    // A revision's Stripe call: billing_correction_moves.
    transition{move, "", "pending", delivery, "0018_corrections.sql: cg_correction_admit",
               "written when the revision starts: one extra charge, or refunds newest payment first"},
    transition{move, "pending", "done", stripe_answer, "correction_ledger.cpp: done_sql",
               "Stripe made the charge or the refund"},
    transition{move, "pending", "declined", stripe_answer, "correction_ledger.cpp: ended_sql",
               "the extra charge was declined"},
    transition{move, "pending", "failed", stripe_answer, "correction_ledger.cpp: ended_sql",
               "Stripe refused the move as sent (cap, idempotency_error, rejected)"},
    transition{move, "pending", "done", search_found, "correction_ledger.cpp: done_sql",
               "the search found the move's charge or refund made"},
    transition{move, "pending", "declined", search_found, "correction_ledger.cpp: ended_sql",
               "the search found the move's charge failed"},
};

constexpr std::array<std::string_view, 8> charge_states{
    "pending", "processing",  "charged",  "declined",
    "failed",  "cap_blocked", "conflict", "failed_after_processing"};
constexpr std::array<std::string_view, 6> revision_states{"waiting",  "pending", "applied",
                                                          "declined", "failed",  "superseded"};
constexpr std::array<std::string_view, 4> move_states{"pending", "done", "declined", "failed"};

// A move's command for an answer the charge machine read (the shared part: what the answer means).
move_output move_for(charge_step s) {
    move_output o;
    switch (s) {
        case charge_step::mark_charged:
            o = {move_command::done, "done", "pending", verdict::action::finish, verdict_reason::charged, {}};
            break;
        case charge_step::mark_declined:
            o = {move_command::declined,   "declined", "declined", verdict::action::finish,
                 verdict_reason::declined, {}};
            break;
        case charge_step::mark_cap_blocked:
            o = {move_command::failed_dead_letter,
                 "failed",
                 "failed",
                 verdict::action::finish,
                 verdict_reason::cap_blocked,
                 "spend cap exceeded"};
            break;
        case charge_step::mark_conflict_dead_letter:
            o = {move_command::failed_dead_letter,
                 "failed",
                 "failed",
                 verdict::action::finish,
                 verdict_reason::dead_lettered,
                 "stripe idempotency_error"};
            break;
        case charge_step::mark_failed_dead_letter:
            o = {move_command::failed_dead_letter, "failed",         "failed", verdict::action::finish,
                 verdict_reason::dead_lettered,    "stripe rejected"};
            break;
        case charge_step::release_requeue:
            o = {move_command::release,
                 "pending",
                 "pending",
                 verdict::action::requeue,
                 verdict_reason::requeued_retry_same_key,
                 {}};
            break;
        case charge_step::setup_requeue:
            o = {move_command::release,
                 "pending",
                 "pending",
                 verdict::action::requeue,
                 verdict_reason::requeued_stripe_unavailable,
                 {}};
            break;
        // A move has no processing state: its payment in flight is followed up by the search.
        case charge_step::mark_processing:
        case charge_step::mark_indeterminate_requeue:
            o = {move_command::indeterminate,
                 "pending",
                 "pending",
                 verdict::action::requeue,
                 verdict_reason::requeued_indeterminate,
                 {}};
            break;
    }
    return o;
}

}  // namespace

std::string_view to_string(table t) noexcept {
    switch (t) {
        case table::charge:
            return "charge";
        case table::revision:
            return "revision";
        case table::move:
            return "move";
    }
    return "?";
}

std::string_view to_string(input i) noexcept {
    switch (i) {
        case input::delivery:
            return "delivery";
        case input::stripe_answer:
            return "Stripe answer";
        case input::search_found:
            return "search found";
        case input::payment_fact:
            return "webhook or poll fact";
        case input::backfill:
            return "backfill";
        case input::moves_ended:
            return "moves ended";
        case input::later_revision:
            return "later revision";
        case input::retry_declined:
            return "operator: retry-declined";
        case input::replay:
            return "operator: dead-letter replay";
    }
    return "?";
}

std::string_view to_string(move_command c) noexcept {
    switch (c) {
        case move_command::done:
            return "done";
        case move_command::declined:
            return "declined";
        case move_command::failed_dead_letter:
            return "failed_dead_letter";
        case move_command::release:
            return "release";
        case move_command::indeterminate:
            return "indeterminate";
    }
    return "?";
}

std::string_view to_string(found_command c) noexcept {
    switch (c) {
        case found_command::mark_charged:
            return "mark_charged";
        case found_command::mark_declined:
            return "mark_declined";
        case found_command::mark_processing:
            return "mark_processing";
        case found_command::still_open:
            return "still_open";
        case found_command::none:
            return "none";
    }
    return "?";
}

std::span<const transition> transitions() noexcept {
    return all_transitions;
}

std::span<const std::string_view> states(table t) noexcept {
    switch (t) {
        case table::charge:
            return charge_states;
        case table::revision:
            return revision_states;
        case table::move:
            return move_states;
    }
    return {};
}

bool allowed(table t, std::string_view from, std::string_view to) noexcept {
    for (const auto& tr : all_transitions)
        if (tr.on == t && tr.from == from && tr.to == to) return true;
    return false;
}

bool allowed(record_status from, record_status to) noexcept {
    return allowed(table::charge, to_string(from), to_string(to));
}

answer_output on_answer(const stripe::charge_outcome& out) {
    auto step = step_for(out);
    // Nothing to follow: a payment in flight with neither a charge nor an intent id.
    if (step == charge_step::mark_processing && out.charge_id.empty() && out.payment_intent_id.empty())
        step = charge_step::mark_indeterminate_requeue;
    // A success without a charge id cannot be recorded as charged: it may have happened.
    if (step == charge_step::mark_charged && out.charge_id.empty())
        step = charge_step::mark_indeterminate_requeue;
    answer_output o;
    o.command = step;
    switch (step) {
        case charge_step::mark_charged:
            o.to = record_status::charged;
            o.nsq = verdict::action::finish;
            o.reason = verdict_reason::charged;
            break;
        case charge_step::mark_processing:
            o.to = record_status::processing;
            o.nsq = verdict::action::finish;
            o.reason = verdict_reason::processing;
            // requires_capture: an authorisation chargeguard never asks for.
            o.alert = stripe::intent_movement(out.in_flight_status) == stripe::movement::authorised;
            break;
        case charge_step::mark_declined:
            o.to = record_status::declined;
            o.nsq = verdict::action::finish;
            o.reason =
                needs_authentication(out) ? verdict_reason::needs_authentication : verdict_reason::declined;
            break;
        case charge_step::mark_cap_blocked:
            o.to = record_status::cap_blocked;
            o.nsq = verdict::action::finish;
            o.reason = verdict_reason::cap_blocked;
            o.letter = "spend cap exceeded";
            o.alert = true;
            break;
        case charge_step::mark_conflict_dead_letter:
            o.to = record_status::conflict;
            o.nsq = verdict::action::finish;
            o.reason = verdict_reason::dead_lettered;
            o.letter = "stripe idempotency_error";
            break;
        case charge_step::mark_failed_dead_letter:
            o.to = record_status::failed;
            o.nsq = verdict::action::finish;
            o.reason = verdict_reason::dead_lettered;
            o.letter = "stripe rejected";
            break;
        case charge_step::release_requeue:
            o.reason = verdict_reason::requeued_retry_same_key;
            break;
        case charge_step::setup_requeue:
            o.reason = verdict_reason::requeued_stripe_unavailable;
            o.alert = true;
            break;
        case charge_step::mark_indeterminate_requeue:
            o.reason = verdict_reason::requeued_indeterminate;
            break;
    }
    return o;
}

move_output on_move_answer(const stripe::charge_outcome& out) {
    return move_for(on_answer(out).command);
}

move_output on_refund_answer(stripe::outcome_class cls, std::string_view refund_status) {
    // A refund that failed at once moved nothing: a new try needs a new key, as after a search. A refund is
    // never "declined": such an answer is read as open.
    if (cls == stripe::outcome_class::declined ||
        (!refund_status.empty() && stripe::refund_movement(refund_status) == stripe::movement::refund_undone))
        cls = stripe::outcome_class::indeterminate;
    auto o = move_for(step_for(cls));
    if (o.command == move_command::done) o.reason = verdict_reason::refunded;
    return o;
}

found_command on_found(table t, const stripe::fact& f) noexcept {
    using stripe::movement;
    if (f.object == stripe::object_kind::refund)
        return f.moved == movement::refund_undone ? found_command::none : found_command::mark_charged;
    const bool processing_state = t == table::charge;
    // A bank debit that failed while the answer to its create was lost failed after processing: the row goes
    // processing first, and the recorded failure or the poll fails it with its dead letter, whose replay
    // charges again. Declined would end it uncharged for good. A move has no such state: declined.
    if (f.moved == movement::failed && f.bank_debit && processing_state)
        return found_command::mark_processing;
    switch (f.moved) {
        case movement::charged:
            // An intent succeeded without a latest_charge yet: still open.
            return f.charge_id.empty() ? found_command::still_open : found_command::mark_charged;
        case movement::in_flight:
        case movement::authorised:
            return processing_state ? found_command::mark_processing : found_command::still_open;
        // We always create with confirm=true, so an intent still requires_confirmation is one whose confirm
        // never ran: Stripe has not tried the card, and nobody else can confirm it (its client secret never
        // left Stripe's answer to us), so a new generation's intent is the only one that can move money.
        case movement::not_tried:
            return found_command::none;
        case movement::failed:
        case movement::needs_customer:
        case movement::canceled:
            return found_command::mark_declined;
        default:
            // A status the pinned API version does not define: the payment exists, what it did is unknown.
            return found_command::still_open;
    }
}

verdict on_postgres_error(const backoff& b, std::int32_t attempts, const error& e, std::string_view step) {
    return verdict::requeue(verdict_reason::requeued_postgres, backoff_delay(b, attempts),
                            std::string(step) + ": " + e.describe());
}

}  // namespace cg::billing::machine
