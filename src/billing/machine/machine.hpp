// The money machine (docs/design.md §4 "The money machine"): one table of the states a money row passes and
// the inputs that move it, and the decisions that read an input into the row's next step. A charge
// (billing_records) and a correction revision (billing_corrections, whose Stripe calls are its moves,
// billing_correction_moves) are the same machine: a pending row under a lease makes one Stripe call at a
// time, and the same answer or the same found fact means the same thing for both; they differ only in the
// states their tables name for it (a charge's `charged` is a move's `done`).
//
// Pure: no Asio, no database, no clock. Its decisions are taken by the sans-io fsms of one delivery, the
// charge's (charge_fsm.hpp) and a correction revision's (revision_fsm.hpp), whose commands
// billing::charge_flow and billing::corrections only run; by the healers and the operator commands
// (machine_heal.cpp below); and by reconcile, which applies on_reconcile_found to the reading of
// billing::search_by_key's find (billing/flow/recovery.hpp). The statements that move a row's state are
// checked against its transitions by tests/unit/billing/machine_test.cpp, and the table is printed into
// docs/design.md from transitions() (the same test keeps them equal).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "billing/machine/decision.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/machine/settlement.hpp"
#include "core/result.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"

namespace cg::billing::machine {

// The table a state belongs to.
enum class table {
    charge,    // billing_records.status
    revision,  // billing_corrections.status
    move,      // billing_correction_moves.status
};
std::string_view to_string(table t) noexcept;

// What moves a row.
enum class input {
    delivery,        // a delivery's pre-flight insert, or a revision's admit step
    stripe_answer,   // the answer to the row's create call (charge, PaymentIntent, refund)
    search_found,    // the recovery search found the row's payment at Stripe
    payment_fact,    // a webhook event, or the poll's retrieve, about the row's payment (settlement.hpp)
    backfill,        // a Stripe charge that carries a key the ledger has no row for
    moves_ended,     // every move of a revision ended (done, or one declined or failed)
    later_revision,  // a later revision of the period started first
    retry_declined,  // an operator's retry-declined
    replay,          // an operator's dead-letter replay
};
std::string_view to_string(input i) noexcept;

// One allowed move of a row's state. `from` empty: the row is created in `to`.
struct transition {
    table on;
    std::string_view from;
    std::string_view to;
    input by;
    std::string_view command;  // what writes it: the statement or the step
    std::string_view why;
};

// Every allowed transition, in the order docs/design.md prints them.
std::span<const transition> transitions() noexcept;
// Whether `from` → `to` is allowed on `t` (by any input). A state moved to itself is no transition.
bool allowed(table t, std::string_view from, std::string_view to) noexcept;
bool allowed(record_status from, record_status to) noexcept;
// The states `t` has.
std::span<const std::string_view> states(table t) noexcept;

// The transition table as docs/design.md shows it (markdown, one row per transition).
std::string markdown();
// The outputs for every answer the Stripe client can give (markdown, one row per answer): for a charge the
// ledger command, its state, FIN or REQ, the verdict, the dead letter and the alert; for a correction's move
// the move's command and states. docs/design.md prints it beside the transitions.
std::string answers_markdown();

// What the pipeline does with the answer to a pending row's create call: the ledger command (its statement
// moves the row to `to`, or keeps it pending for the requeue commands), FIN or REQ, the verdict, the dead
// letter to write first (empty: none) and whether it is an alert.
struct answer_output {
    charge_step command = charge_step::mark_indeterminate_requeue;
    record_status to = record_status::pending;
    verdict::action nsq = verdict::action::requeue;
    verdict_reason reason = verdict_reason::requeued_indeterminate;
    std::string_view letter;
    bool alert = false;
};
// Total over every answer: a success without a charge id, or a payment in flight without an id to follow,
// is "may have happened" (indeterminate), never charged.
answer_output on_answer(const stripe::charge_outcome& out);

// The same answer for a correction's move. A move has no processing state: a payment still in flight (or a
// refund that failed at once) is followed up by the search under the move's key, as an open answer is.
enum class move_command {
    done,                // the move is done; the revision goes on with its next move
    declined,            // the move and the revision are declined
    failed_dead_letter,  // a dead letter, then the move and the revision failed
    release,             // nothing happened: the lease released, REQ
    indeterminate,       // may have happened: indeterminate_since, the lease released, REQ
};
std::string_view to_string(move_command c) noexcept;
struct move_output {
    move_command command = move_command::indeterminate;
    std::string_view to = "pending";           // the move's state after it
    std::string_view revision_to = "pending";  // the revision's
    verdict::action nsq = verdict::action::requeue;
    verdict_reason reason = verdict_reason::requeued_indeterminate;
    std::string_view letter;
};
move_output on_move_answer(const stripe::charge_outcome& out);
// A refund's answer: its class, and the status of the refund it returned (empty: none).
move_output on_refund_answer(stripe::outcome_class cls, std::string_view refund_status);

// What the recovery search's find makes of the row (for a charge) or of the move (for a correction's
// move, where `processing` does not exist: a payment in flight is `still_open`).
enum class found_command {
    mark_charged,     // the money moved: charged (a move: done)
    mark_declined,    // the attempt failed for good
    mark_processing,  // the money will move or fail without anyone acting: the row waits as processing
    still_open,       // ours and moving (or a status the pinned API version does not define): look later
    none,             // not this row's payment: as if nothing carried the key (a new generation)
};
std::string_view to_string(found_command c) noexcept;
found_command on_found(table t, const stripe::fact& f) noexcept;

// A statement failed: REQ with the PostgreSQL backoff, the verdict naming the step.
verdict on_postgres_error(const backoff& b, std::int32_t attempts, const error& e, std::string_view step);

// ---- The healers and the operator commands (machine_heal.cpp)
// ---------------------------------------------- They run these decisions rather than compare states
// themselves; each target state is one the table above allows for their input
// (tests/unit/billing/machine_heal_test.cpp checks it).

// What a dead letter's replay does with the ledger row of its key (input::replay).
enum class replay_command {
    publish,              // pending: the pipeline is on it, one more delivery is harmless
    reopen_then_publish,  // failed, cap_blocked, failed_after_processing: back to pending, then published
    refuse_superseded,    // charged or processing: the event would be finished as a duplicate
    refuse_declined,      // declined: retry-declined reopens it, not a replay
    refuse_conflict,      // conflict: resolved by hand
};
std::string_view to_string(replay_command c) noexcept;
replay_command on_replay(record_status s) noexcept;

// What retry-declined does with a row it was asked to retry (input::retry_declined).
enum class retry_command {
    reopen,           // declined: reopened under a new key generation, then published
    follow_pending,   // pending: published again when a retry of its generation is under way, else nothing
    already_charged,  // charged: nothing to retry
    not_declined,     // anything else: not retried (dead letters, processing…)
};
std::string_view to_string(retry_command c) noexcept;
retry_command on_retry_declined(record_status s) noexcept;

// A row in this state waits for Stripe's word on a payment in flight (a webhook or the poll ends it); the
// poller counts a row that left it as settled, the backfill a recovered row still in it as processing.
bool awaits_payment_fact(record_status s) noexcept;

// A successful payment carrying the row's key is still to be recorded by the machine in this state
// (recovery's search for pending, a payment fact for processing); in any other state it is money the ledger
// does not account for (reconcile reports it).
bool records_found_payment(record_status s) noexcept;

// What the backfill makes of a Stripe charge carrying a key the ledger has no row for (input::backfill).
enum class backfill_command {
    none,                         // nothing moved, or in flight and not followed: no row
    insert_charged,               // the money moved: the row is recorded charged
    insert_processing,            // a bank debit in flight: the row waits as processing
    insert_processing_then_fail,  // a bank debit that failed: processing, then failed after processing
};
std::string_view to_string(backfill_command c) noexcept;
// `follow_in_flight`: the backfill can write a dead letter for a debit that fails (it knows the topic).
backfill_command on_backfill(const stripe::fact& f, bool follow_in_flight) noexcept;

// What an operator's reconcile does with the recovery search's find for a pending row: it records a final
// answer only; a payment still moving (or none) is left to the pipeline, which follows it.
enum class reconcile_command {
    leave,          // nothing found, or a payment still moving
    mark_charged,   // pending → charged
    mark_declined,  // pending → declined
};
std::string_view to_string(reconcile_command c) noexcept;
reconcile_command on_reconcile_found(found_command c) noexcept;

// A payment fact about a refund (one refund, or a charge's cumulative refunds): the vault's reservation is
// refunded by it and it is recorded by what it names; and whether a fact's Stripe status is the payment's
// own (a dispute's or a refund's is not; an unknown event type has none).
bool names_refund(fact_kind k) noexcept;
bool states_payment_status(fact_kind k) noexcept;

}  // namespace cg::billing::machine
