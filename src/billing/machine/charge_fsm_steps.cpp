// The charge fsm's steps (charge_fsm.hpp): the decision on an existing row, RECOVER's search and new key
// generation, the create call and what its answer, or the search's find, makes of the row.
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "billing/machine/charge_fsm.hpp"
#include "stripe/fact.hpp"

namespace cg::billing::machine {
namespace {

std::optional<std::string> nonempty(const std::string& s) {
    if (s.empty()) return std::nullopt;
    return s;
}

}  // namespace

command charge_fsm::on_existing(const ledger_record& rec, sys_time now) {
    // Same customer and period under another key (another key namespace produced it): never a second charge.
    if (rec.key != key_) {
        auto c = dead_letter("conflict", rec.key);
        c.note = "customer and period already recorded under another key: " + rec.key;
        c.warn = true;
        return c;
    }
    switch (decide_existing(rec, ev_, now, cfg_->same_key_window)) {
        case existing_action::duplicate_finish:
            return finish(verdict::finish(verdict_reason::duplicate_prevented,
                                          std::string(billing::to_string(rec.status))));
        case existing_action::payload_conflict:
            // The recorded row stays as it is: a human decides which amount is right.
            return dead_letter("conflict", key_);
        case existing_action::lease_held_requeue:
            return lease_held(rec.lease_remaining);
        case existing_action::recover_same_key:
        case existing_action::recover_search: {
            // RECOVER: take the expired lease (by the database clock), then decide again on the row we then
            // hold — it may have moved since it was read.
            command c;
            c.what = op::take_lease;
            c.name = "take lease";
            return emit(std::move(c), at::take);
        }
    }
    throw std::logic_error("unknown existing_action");
}

command charge_fsm::record_attempt() {
    // The attempt (and a fresh lease) recorded before Stripe hears of the call.
    command c;
    c.what = op::record_attempt;
    c.name = "record attempt";
    return emit(std::move(c), at::attempt);
}

command charge_fsm::create() {
    command c;
    c.what = op::create;
    lease_lost_ = false;
    c.request = build_request(ev_, key_, gen_);
    return emit(std::move(c), at::create);
}

// The payments the row's earlier lives made (billing_retries), read before `next`.
command charge_fsm::read_retries(at next) {
    command c;
    c.what = op::superseded_payments;
    c.name = "read retries";
    return emit(std::move(c), next);
}

command charge_fsm::start_search() {
    if (gen_ >= 2) {
        // Maybe a retried declined row: its earlier attempts' payments are not this generation's answer.
        return read_retries(at::superseded);
    }
    return search_charges();
}

command charge_fsm::search_charges() {
    command c;
    c.what = op::search_charges;
    c.search.stripe_customer_id = ev_.stripe_customer_id;
    c.search.key = key_;
    if (first_attempt_)
        c.search.since = std::chrono::duration_cast<std::chrono::seconds>(
                             (*first_attempt_ - cfg_->search_slack).time_since_epoch())
                             .count();
    c.search.stripe_account = ev_.stripe_account;
    return emit(std::move(c), at::charges);
}

// Charges first: every confirmed intent that reached the card made one (carrying the intent's metadata).
command charge_fsm::after_charges(std::optional<stripe::charge> ch) {
    std::string note;
    if (ch && superseded_failure(stripe::read(*ch), ch->created, superseded_, first_attempt_)) {
        note =
            "a failed charge from before the replay carries the key: not this generation's answer: " + ch->id;
        ch.reset();
    }
    if (!ch && ev_.uses_payment_intent()) {
        // An intent that never reached the card made no charge: the customer's PaymentIntents are searched.
        auto c = search_charges();
        c.what = op::search_intents;
        c.note = std::move(note);
        return emit(std::move(c), at::intents);
    }
    if (!ch) {
        auto c = bump();
        if (!note.empty()) c.note = std::move(note);
        return c;
    }
    // The charge's fact, as the money machine reads it (on_found): a bank debit that failed while the answer
    // to its create call was lost failed after processing, so it goes processing first; a status the pinned
    // API version does not define is looked at again later, never charged beside.
    const auto found = on_found(table::charge, stripe::read(*ch));
    const std::string what = "charge " + ch->id;
    switch (found) {
        case found_command::mark_charged: {
            auto c = settle(charge_step::mark_charged, "mark charged",
                            verdict::finish(verdict_reason::charged, "found existing charge " + ch->id));
            c.charge_id = ch->id;
            c.payment_intent_id = nonempty(ch->payment_intent);
            journal_ = journal_note{record_status::charged, ch->id, c.payment_intent_id, std::nullopt};
            not_changed_ = "row already settled by another worker: " + ch->id;
            return c;
        }
        case found_command::mark_declined: {
            auto why = "declined (found by search): " + ch->failure_code;
            auto c = settle(charge_step::mark_declined, "mark declined",
                            verdict::finish(verdict_reason::declined, "found declined charge " + ch->id));
            c.charge_id = ch->id;
            c.payment_intent_id = nonempty(ch->payment_intent);
            c.text = why;
            journal_ = journal_note{record_status::declined, ch->id, c.payment_intent_id, std::move(why)};
            return c;
        }
        case found_command::mark_processing:
            return leave_processing(ch->id, nonempty(ch->payment_intent), ch->status);
        case found_command::still_open:
        case found_command::none:
            break;
    }
    // Succeeding but no charge yet (or a status Stripe's pinned version does not define): the payment is ours
    // and moving; look again later, never recharge.
    return release(what + " still open",
                   verdict::requeue(verdict_reason::requeued_indeterminate, cfg_->indeterminate_delay,
                                    what + " is " + ch->status + " without a settled charge yet"));
}

command charge_fsm::after_intents(std::optional<stripe::payment_intent> pi) {
    std::string note;
    std::optional<stripe::fact> fact;
    if (pi) fact = stripe::read(*pi);
    if (pi && superseded_failure(*fact, pi->created, superseded_, first_attempt_)) {
        note = "a failed payment intent from before the replay carries the key: not this generation's: " +
               pi->id;
        pi.reset();
    }
    // The intent as the money machine reads it: `none` is an intent Stripe never tried, as if nothing carried
    // the key.
    const auto step = pi ? on_found(table::charge, *fact) : found_command::none;
    if (pi && step == found_command::none)
        note = "the payment intent found was never confirmed: Stripe did not try the card: " + pi->id;
    command c;
    switch (step) {
        case found_command::none:
            c = bump();
            break;
        case found_command::mark_charged:
            c = settle(charge_step::mark_charged, "mark charged",
                       verdict::finish(verdict_reason::charged, "found existing payment intent " + pi->id));
            c.charge_id = nonempty(pi->latest_charge);
            c.payment_intent_id = pi->id;
            journal_ = journal_note{record_status::charged, pi->latest_charge, pi->id, std::nullopt};
            not_changed_ = "row already settled by another worker: " + pi->id;
            break;
        case found_command::mark_declined: {
            auto decline = "payment intent " + pi->id + " is " + pi->status;
            if (!pi->last_error_code.empty()) decline += ": " + pi->last_error_code;
            auto why = "declined (found by search): " + decline;
            const bool authenticate = needs_authentication(pi->last_error_code, &*fact);
            c = settle(charge_step::mark_declined, "mark declined",
                       verdict::finish(
                           authenticate ? verdict_reason::needs_authentication : verdict_reason::declined,
                           "found " + decline));
            c.charge_id = nonempty(pi->latest_charge);
            c.payment_intent_id = pi->id;
            c.text = why;
            journal_ = journal_note{record_status::declined, pi->latest_charge, pi->id, std::move(why)};
            break;
        }
        case found_command::mark_processing:
            c = leave_processing(nonempty(pi->latest_charge), pi->id, pi->status);
            break;
        case found_command::still_open: {
            const std::string what = "payment intent " + pi->id;
            c = release(what + " still open",
                        verdict::requeue(verdict_reason::requeued_indeterminate, cfg_->indeterminate_delay,
                                         what + " is " + pi->status + " without a settled charge yet"));
            break;
        }
    }
    if (!note.empty()) {
        c.note = std::move(note);
        c.warn = step == found_command::none && pi.has_value();
    }
    return c;
}

// Nothing carries the key: a new key generation, once no call under the old one can still land.
command charge_fsm::bump() {
    command c;
    c.what = op::bump_generation;
    c.name = "bump generation";
    return emit(std::move(c), at::bump);
}

// A row reopened under a new key generation (a retry, a replay) whose call Stripe answered with a payment
// that is not a success: the payment may be an earlier life's, which Stripe replays when a failover lost the
// bump that had already used this generation. The earlier lives' payments are read first.
command charge_fsm::after_create(const stripe::charge_outcome& out) {
    const bool names_payment = !out.charge_id.empty() || !out.payment_intent_id.empty();
    if (gen_ >= 2 && !superseded_read_ && names_payment &&
        on_answer(out).command != charge_step::mark_charged) {
        answer_ = out;
        return read_retries(at::answer_superseded);
    }
    return answered(out);
}

command charge_fsm::after_superseded(const stripe::charge_outcome& out) {
    const auto earlier = [this](const std::string& id) {
        return !id.empty() && std::find(superseded_.begin(), superseded_.end(), id) != superseded_.end();
    };
    if (!earlier(out.charge_id) && !earlier(out.payment_intent_id)) return answered(out);
    // Stripe keeps that payment as this key's answer: no call under the key can move money any more, so the
    // next generation needs no quiet period.
    auto c = bump();
    c.quiet = std::chrono::milliseconds(0);
    c.note = "Stripe answered key generation " + std::to_string(gen_) +
             " with a payment an earlier life of the row made (" +
             (earlier(out.charge_id) ? out.charge_id : out.payment_intent_id) +
             "): the key is spent; charging under the next generation";
    c.warn = true;
    return c;
}

// Stripe's answer to the create call: settled, after the chaos failpoint's pause when it is set.
command charge_fsm::answered(const stripe::charge_outcome& out) {
    if (cfg_->step_pauses) {  // between Stripe's answer and the ledger update
        parked_ = settle_answer(out);
        auto next = at_;
        command p;
        p.what = op::pause;
        at_ = at::answer_pause;
        answer_next_ = next;
        return p;
    }
    return settle_answer(out);
}

// The answer as the money machine reads it (on_answer): the ledger command, then FIN or REQ.
command charge_fsm::settle_answer(const stripe::charge_outcome& out) {
    const auto o = on_answer(out);
    const auto& msg = out.message;
    const auto intent = nonempty(out.payment_intent_id);
    command c;
    switch (o.command) {
        case charge_step::mark_processing:
            return leave_processing(nonempty(out.charge_id), intent, out.in_flight_status);
        case charge_step::mark_charged:
            c = settle(o.command, "mark charged", verdict::finish(o.reason, out.charge_id));
            c.charge_id = out.charge_id;
            journal_ = journal_note{record_status::charged, out.charge_id, intent, std::nullopt};
            not_changed_ = "row already settled by another worker: " + out.charge_id;
            break;
        case charge_step::mark_declined:
            c = settle(o.command, "mark declined", verdict::finish(o.reason, msg));
            c.charge_id = nonempty(out.charge_id);
            c.text = msg;
            journal_ = journal_note{record_status::declined, out.charge_id, intent, msg};
            break;
        case charge_step::mark_cap_blocked:
            // With a dead letter: once the cap is raised (or the spend behind it explained), replaying the
            // letter reopens the row and charges it.
            c = settle(o.command, "mark cap_blocked", verdict::finish(o.reason, msg));
            c.note = "alert: spend cap exceeded, charge blocked: " + msg;
            c.warn = true;
            break;
        case charge_step::mark_conflict_dead_letter:
            c = settle(o.command, "mark conflict",
                       verdict::finish(o.reason, std::string(o.letter) + ": " + msg));
            break;
        case charge_step::mark_failed_dead_letter:
            c = settle(o.command, "mark failed",
                       verdict::finish(o.reason, std::string(o.letter) + ": " + msg));
            break;
        case charge_step::release_requeue:
            c = settle(o.command, "release lease",
                       verdict::requeue(o.reason, cfg_->retry_same_key_delay, msg));
            break;
        case charge_step::setup_requeue:
            // Our key, its permissions or the address are wrong (or something in front of Stripe refused):
            // nothing happened, and the event is as valid as before. Keep it until an operator fixes it.
            c = settle(charge_step::release_requeue, "release lease",
                       verdict::requeue(o.reason, cfg_->stripe_unavailable_delay, msg));
            c.note =
                "alert: Stripe refused the request for our setup (API key, permissions or address); the "
                "event "
                "stays pending and is retried: " +
                msg;
            break;
        case charge_step::mark_indeterminate_requeue:
            c = settle(o.command, "mark indeterminate",
                       verdict::requeue(o.reason, cfg_->indeterminate_delay, msg));
            break;
    }
    c.text = msg;
    c.payment_intent_id = intent;
    c.letter = std::string(o.letter);
    c.alert = o.alert;
    return c;
}

// Stripe answered, the money has not moved: the row goes processing (durably, with the delivery a later
// failure's dead letter needs) and the message is finished; a webhook or the poll of rows left processing
// follows the payment to its end. Events Stripe delivered before this answer (a payment_failed can overtake
// the create call's response) were recorded against the pending row: they are applied then.
// requires_capture is an anomaly — chargeguard never asks for manual capture — and is not a charge either:
// the authorisation is kept as processing (alerted), neither counted as paid nor charged a second time.
command charge_fsm::leave_processing(std::optional<std::string> charge_id, std::optional<std::string> intent,
                                     std::string status) {
    std::string detail = "processing: " + intent.value_or(charge_id.value_or(""));
    auto c = settle(charge_step::mark_processing, "mark processing",
                    verdict::finish(verdict_reason::processing, std::move(detail)));
    c.alert = stripe::intent_movement(status) == stripe::movement::authorised;
    not_changed_ = "row already settled by another worker: " + intent.value_or("");
    c.charge_id = std::move(charge_id);
    c.payment_intent_id = std::move(intent);
    c.status = std::move(status);
    at_ = at::processing;
    return c;
}

}  // namespace cg::billing::machine
