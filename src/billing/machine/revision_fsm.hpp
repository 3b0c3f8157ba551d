// One delivery of a correction revision as a sans-io state machine (docs/design.md §4a): the same shape as
// the charge fsm (charge_fsm.hpp) — resume(input) -> command, no I/O, no clock — over the revision's
// statements (cg_correction_admit, its moves, each move's attempt, answer, search and key generation).
// billing::corrections is its driver. A move is the charge machine's call: its attempt recorded under the
// revision's lease before the call, an open answer or a key past the same-key window sent to the search,
// and a new key generation only once the search found nothing and no call under the old key showed life
// for new_key_quiet; Stripe's answers and finds read by on_move_answer, on_refund_answer and on_found.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "billing/machine/charge_fsm.hpp"

namespace cg::billing::machine {

// A revision's move as its statements read it (billing_correction_moves), with its key.
struct move_view {
    std::int32_t part = 1;
    bool refund = false;
    std::int64_t amount_cents = 0;
    std::string refund_of;  // a refund's charge
    std::int32_t key_generation = 1;
    std::string status;  // pending | done | declined | failed
    std::string stripe_object_id;
    std::optional<sys_time> first_stripe_attempt_at;
    std::optional<sys_time> indeterminate_since;
    std::string key;  // correction_move_key(base, revision, part): metadata[billing_key] of its objects
};

enum class rop {
    admit,               // cg_correction_admit
    moves,               // the revision's moves, in order
    record_attempt,      // the move's attempt under the revision's lease (`epoch`)
    move_done,           // `object_id`, `intent_id`
    move_ended,          // `status` with `text`
    move_indeterminate,  // the open answer noted, the lease released
    release,             // the lease released (`text`: why)
    bump_generation,     // the move's key generation + 1, once quiet
    finish,              // the revision's end: `status`, `text`
    dead_letter,         // `text`: its reason
    create_charge,       // Stripe: the extra charge `request` (metadata set)
    create_refund,       // Stripe: a refund of `refund_of`
    search_charge,       // Stripe: the customer's charges carrying metadata[billing_key] = move key
    search_refund,       // Stripe: the refunds of `refund_of` carrying it
    done,                // FIN or REQ: `result`
};
std::string_view to_string(rop o) noexcept;

struct revision_command {
    rop what = rop::done;
    std::string_view name;  // the step as a failed statement's verdict names it
    std::int32_t part = 0;
    std::int32_t generation = 1;
    std::int64_t epoch = 0;
    std::string status;
    std::string text;
    std::string object_id;
    std::optional<std::string> intent_id;
    create_request request;  // create_charge
    std::string refund_of;   // create_refund, search_refund
    std::int64_t amount_cents = 0;
    std::string idempotency_key;
    stripe::metadata metadata;
    std::string move_key;  // searches
    std::optional<std::int64_t> since;
    verdict result;  // done
    std::string note;
    bool warn = false;
};

namespace in {
struct revision {  // the delivery of a correction, parsed, and the keys it moves under
    billing_event ev;
    std::string base;  // the original charge's key
    std::string key;   // correction_key(base, revision)
    std::int32_t attempts = 1;
    double unit = 0;
};
struct admitted {
    std::string action;  // wait_original | wait_predecessor | lease_held | final | superseded | applied_zero
                         // | original_declined | conflict | run
    std::string detail;
    std::int64_t epoch = 0;
    std::chrono::milliseconds lease_remaining{0};
    std::int64_t delta = 0;
};
struct moves {
    std::vector<move_view> list;
    sys_time now;
};
struct leased {  // record_attempt: the new epoch; nullopt: the lease is not ours
    std::optional<std::int64_t> epoch;
};
struct refund_answer {
    stripe::outcome_class cls = stripe::outcome_class::indeterminate;
    std::string message;
    std::optional<stripe::refund> refund;
};
struct refund_found {
    std::optional<stripe::refund> found;
};
}  // namespace in

using revision_input =
    std::variant<in::revision, in::failed, in::admitted, in::moves, in::applied, in::leased, in::bumped,
                 in::answer, in::refund_answer, in::charge_found, in::refund_found>;

class revision_fsm {
  public:
    explicit revision_fsm(const flow_config& cfg) : cfg_(&cfg) {}

    revision_command resume(const revision_input& i);

    const std::string& key() const noexcept { return key_; }
    // The revision's lease epoch held now; renewals during a move's call move it on.
    std::int64_t held_lease() const noexcept { return epoch_; }
    // While a move's call is outstanding (else std::logic_error): the next lease renewal, and its result.
    renew_command renewal() const;
    void renewed(const in::renewed& r);
    // The move whose call is under way.
    const move_view& current() const noexcept { return move_; }

  private:
    enum class at {
        start,
        admit,
        conflict_letter,
        moves,
        ended_finish,
        applied_moves,
        applied_finish,
        search,
        searched_done,
        searched_declined,
        searched_declined_finish,
        bump,
        attempt,
        call,
        move_done,
        move_declined,
        move_declined_finish,
        letter,
        letter_ended,
        letter_finish,
        release_then,
        spent,
    };

    revision_command next_move();
    revision_command after_search(const revision_input& i);
    revision_command bump();
    revision_command run_move();
    revision_command after_answer(const move_output& o, std::string object_id, std::string intent_id,
                                  std::string message);
    revision_command statement(rop what, std::string_view name, at next);
    revision_command done(verdict v);
    revision_command waiting(std::string detail);
    revision_command postgres_failed(const error& e);

    const flow_config* cfg_;
    at at_ = at::start;
    billing_event ev_;
    std::string base_;
    std::string key_;
    std::int32_t attempts_ = 1;
    double unit_ = 0;
    std::int64_t epoch_ = 0;
    bool lease_lost_ = false;  // a renewal during this call found the lease taken over
    std::int64_t delta_ = 0;
    std::vector<move_view> moves_;
    std::size_t index_ = 0;
    sys_time now_{};
    move_view move_;
    std::string_view step_name_;
    verdict then_;
    // What the pending statements of an ending move write: the revision's state and note, the move's note.
    std::string finish_status_, finish_text_, move_text_;
};

}  // namespace cg::billing::machine
