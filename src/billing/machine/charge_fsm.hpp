// One delivery of a charge as a sans-io state machine (docs/design.md §4 "How the flow is driven"): every
// decision of the charge flow — pre-flight, the decision on an existing row, RECOVER's lease take, the same
// key or the search, a new key generation, what Stripe's answer or the search's find makes of the row, each
// requeue's reason and delay — in one object that performs no I/O. Its driver loops
//
//     auto cmd = fsm.resume(start);
//     while (cmd.what != op::done) cmd = fsm.resume(execute(cmd));
//
// as Boost.Redis' `*_fsm` and Boost.MySQL's `sansio` algorithms are driven: billing::charge_flow executes
// the commands against PostgreSQL and Stripe, tests/sim against its in-memory models, and
// tests/unit/billing/charge_fsm_test.cpp feeds input sequences by hand. The fsm never reads a clock or a
// random source: the inputs carry the time (by the caller's clock) and a uniform number for jitter.
//
// The one input that can arrive while a command is outstanding is a lease renewal during the create call
// (lease_keeper beside the call): renewal() says what the next one writes, renewed() takes its result.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "billing/machine/decision.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/machine.hpp"
#include "billing/machine/outcome.hpp"
#include "core/result.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"
#include "stripe/types.hpp"

namespace cg::billing {

// The search for an existing payment starts this long before the row's first Stripe attempt (clock skew
// with Stripe).
inline constexpr std::chrono::seconds default_search_slack{std::chrono::hours(24)};

}  // namespace cg::billing

namespace cg::billing::machine {

// The decisions' parameters: billing::charge_flow_config's (charge_flow.hpp documents each).
struct flow_config {
    std::string key_namespace = "chargeguard";
    std::chrono::milliseconds lease{60'000};
    std::chrono::milliseconds lease_held_delay{10'000};
    std::chrono::milliseconds max_requeue_delay{3'600'000};
    std::chrono::milliseconds retry_same_key_delay{5'000};
    std::chrono::milliseconds indeterminate_delay{30'000};
    std::chrono::milliseconds stripe_unavailable_delay{30'000};
    std::chrono::milliseconds new_key_quiet{300'000};
    std::chrono::milliseconds correction_wait_delay{30'000};
    backoff postgres_backoff{};
    std::chrono::seconds same_key_window{billing::same_key_window};
    std::chrono::seconds search_slack{default_search_slack};
    // The chaos failpoint: `pause` commands after the row is written, after Stripe answers and before the
    // verdict of a delivery (never set in production).
    bool step_pauses = false;
};

// What the driver runs next.
enum class op {
    // The ledger (billing/store/ledger.hpp, retry_store.hpp, settlement_store.hpp), by its statements' names.
    preflight,            // insert the pending row, leased, its first attempt recorded (or read the existing)
    find,                 // the row by key
    take_lease,           // take the pending row's expired lease
    record_attempt,       // stripe_attempts+1 and a fresh lease, before a call under the same key
    superseded_payments,  // the payments a retried or replayed row's earlier lives made (billing_retries)
    bump_generation,      // key_generation+1 once no call under the old one showed life for new_key_quiet
    settle,          // `step`: mark_charged … mark_indeterminate_requeue, release_requeue (lease released)
    apply_recorded,  // the webhook events recorded against the pending row, now that it is processing
    dead_letter,     // add_dead_letter (`text`: its reason, `letter_key`: the key it names)
    // Stripe.
    create,          // create the charge or PaymentIntent `request`, the lease kept alive beside the call
    search_charges,  // the customer's charges carrying metadata[billing_key] (`search`)
    search_intents,  // then its PaymentIntents carrying it
    // The transport and the process.
    pause,       // the chaos failpoint (flow_config::step_pauses); resume with resumed{}
    correction,  // a revision: the corrections machine takes the delivery; resume with corrected{verdict}
    done,        // FIN or REQ: `result`
};
std::string_view to_string(op o) noexcept;

struct search_query {
    std::string stripe_customer_id;
    std::string key;                    // the base key: metadata[billing_key] of every generation's payment
    std::optional<std::int64_t> since;  // unix seconds: the first attempt less the search slack
    std::string stripe_account;
};

// A settle this delivery applied, for the settle journal (billing/flow/settle_journal.hpp).
struct journal_note {
    record_status status = record_status::charged;
    std::string charge_id;
    std::optional<std::string> payment_intent_id;
    std::optional<std::string> message;
};

struct command {
    op what = op::done;
    charge_step step = charge_step::release_requeue;  // op::settle
    std::string_view name;                            // the step as a failed statement's verdict names it
    std::string text;  // settle: last_error or Stripe's message; dead_letter: the letter's reason
    std::optional<std::string> charge_id;
    std::optional<std::string> payment_intent_id;
    std::string status;                     // settle mark_processing: the status Stripe reported
    std::string letter;                     // settle with a dead letter: the letter's reason
    std::optional<std::string> letter_key;  // dead_letter: the key the letter names
    bool alert = false;                     // an operator must look (cap, setup, requires_capture)
    // op::bump_generation: how long no call under the old key must have shown life (nullopt:
    // flow_config::new_key_quiet; zero when Stripe answered the old key with an earlier life's payment).
    std::optional<std::chrono::milliseconds> quiet;
    create_request request;               // op::create
    search_query search;                  // op::search_*
    verdict result;                       // op::done
    std::optional<journal_note> journal;  // op::done: the settle the delivery applied
    std::string note;                     // a line worth logging at this step (empty: none)
    bool warn = false;                    // `note` is a warning
};

// Inputs: how the command the fsm gave last ended.
namespace in {
struct delivery {  // a message from the transport
    std::string_view body;
    std::string_view message_id;
    std::int32_t attempts = 1;
    sys_time now;
    double unit = 0;  // uniform in [0, 1): the requeue jitter
};
struct swept {  // a ledger row no delivery works on any more (the sweeper): its event and the row as read
    billing_event ev;
    ledger_record rec;
    std::int32_t attempts = 1;
    sys_time now;
    double unit = 0;
};
struct failed {  // the statement or the Stripe call failed
    error e;
};
struct preflighted {  // op::preflight
    bool inserted = false;
    ledger_record record;
    sys_time now;
};
struct row {  // op::take_lease (nullopt: not taken), op::find
    std::optional<ledger_record> rec;
    sys_time now;
};
struct attempted {  // op::record_attempt (nullopt: the lease is not ours)
    std::optional<std::int32_t> generation;
    std::int64_t lease = 0;
};
struct applied {  // op::settle, op::dead_letter, op::apply_recorded: whether it changed anything
    bool changed = true;
};
struct bumped {  // op::bump_generation
    std::optional<std::int32_t> generation;
    std::chrono::milliseconds wait{0};
};
struct superseded {  // op::superseded_payments
    std::vector<std::string> ids;
};
struct answer {  // op::create
    stripe::charge_outcome out;
};
struct charge_found {  // op::search_charges: the newest charge carrying the key
    std::optional<stripe::charge> found;
};
struct intent_found {  // op::search_intents
    std::optional<stripe::payment_intent> found;
};
struct resumed {};  // op::pause
struct corrected {  // op::correction
    verdict v;
};
}  // namespace in

namespace in {
struct renewed {  // a lease renewal during the call: the lease's new epoch, or nullopt: it was taken over
    std::optional<std::int64_t> epoch;
};
}  // namespace in

// What the next lease renewal during a create call writes (both fsms): the lease held under `epoch` extended
// — or, once a renewal found it taken over, only the call noted in flight under its key `generation`, so
// whoever holds the row now takes no new key generation while this call can still move money.
struct renew_command {
    bool note_in_flight = false;
    std::int64_t epoch = 0;
    std::int32_t generation = 1;
};

using fsm_input = std::variant<in::delivery, in::swept, in::failed, in::preflighted, in::row, in::attempted,
                               in::applied, in::bumped, in::superseded, in::answer, in::charge_found,
                               in::intent_found, in::resumed, in::corrected>;

// A payment the recovery search found (its fact, and when Stripe created it) that is a failure saying nothing
// of the current generation: one the row's earlier attempts made (a retried declined row names them), or one
// created well before the first attempt (an earlier life of the row, which a replay superseded; five minutes
// of clock skew allowed). The search drops it, as if nothing carried the key; a success is always believed.
// The one filter of both the charge fsm's search and billing::search_by_key.
bool superseded_failure(const stripe::fact& found, std::int64_t created,
                        const std::vector<std::string>& superseded,
                        std::optional<sys_time> first_attempt) noexcept;

class charge_fsm {
  public:
    explicit charge_fsm(const flow_config& cfg) : cfg_(&cfg) {}

    // The next command for the last one's outcome (the first input: in::delivery or in::swept). After
    // op::done the fsm is spent. An input the current step does not expect is a broken driver:
    // std::logic_error.
    command resume(const fsm_input& i);

    // The delivery's names, as the driver's log, letters and journal need them.
    const std::string& key() const noexcept { return key_; }
    const billing_event& event() const noexcept { return ev_; }
    bool event_known() const noexcept { return parsed_; }
    std::int32_t generation() const noexcept { return gen_; }
    // The lease epoch held now; renewals during the create call move it on.
    std::int64_t held_lease() const noexcept { return lease_; }
    // While the create call is outstanding (else std::logic_error): the next renewal, and its result.
    renew_command renewal() const;
    void renewed(const in::renewed& r);
    // The epoch the delivery's lease started at (its pre-flight or its take).
    std::int64_t first_lease() const noexcept { return attempt_lease_; }

  private:
    enum class at {
        start,
        dead_letter,
        preflight,
        take,
        find,
        attempt,
        superseded,
        charges,
        intents,
        create,
        answer_superseded,
        answer_pause,
        settle,
        processing,
        apply_recorded,
        release,
        search_release,
        bump,
        correction,
        pause_then_create,
        pause_then_done,
        spent,
    };

    command on_existing(const ledger_record& rec, sys_time now);
    command read_retries(at next);
    command start_search();
    command search_charges();
    command after_charges(std::optional<stripe::charge> ch);
    command after_intents(std::optional<stripe::payment_intent> pi);
    command bump();
    command record_attempt();
    command create();
    command after_create(const stripe::charge_outcome& out);
    command after_superseded(const stripe::charge_outcome& out);
    command answered(const stripe::charge_outcome& out);
    command settle_answer(const stripe::charge_outcome& out);
    command leave_processing(std::optional<std::string> charge_id, std::optional<std::string> intent,
                             std::string status);
    command settle(charge_step s, std::string_view name, verdict then);
    command release(std::string why, verdict then);
    command dead_letter(std::string reason, std::optional<std::string> key);
    command lease_held(std::optional<std::chrono::milliseconds> remaining, std::string detail = {});
    command finish(verdict v);
    command postgres_failed(const error& e);
    // Takes the command by reference: a command is large (the create request, the search, the verdict),
    // and a parameter by value would be one more move and destruction of it on every step.
    command emit(command&& c, at next);

    const flow_config* cfg_;
    at at_ = at::start;
    bool delivered_ = false;  // a delivery (not the sweeper): the step pauses apply
    bool parsed_ = false;
    std::int32_t attempts_ = 1;
    double unit_ = 0;
    billing_event ev_;
    std::string key_;
    std::int64_t lease_ = 0;
    std::int64_t attempt_lease_ = 0;
    bool lease_lost_ = false;  // a renewal during this call found the lease taken over
    std::int32_t gen_ = 1;
    std::optional<sys_time> first_attempt_;
    std::vector<std::string> superseded_;
    bool superseded_read_ = false;
    std::optional<stripe::charge_outcome> answer_;  // a create's answer while the superseded ids are read
    std::string_view step_name_;                    // the statement awaited, for a failure's verdict
    // What the pending settle, release or dead letter ends in once it is written.
    verdict then_;
    std::optional<journal_note> journal_;  // noted when the pending settle changed the row
    std::string not_changed_;              // logged when the pending settle found the row settled already
    std::optional<command> parked_;        // the command a pause stands before
    at answer_next_ = at::spent;           // where the fsm goes once the pause after an answer ended
};

}  // namespace cg::billing::machine
