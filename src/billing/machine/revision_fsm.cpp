#include "billing/machine/revision_fsm.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "billing/machine/key.hpp"
#include "stripe/fact.hpp"

namespace cg::billing::machine {
namespace {

template <class T>
const T& expect(const revision_input& i, std::string_view step) {
    if (const auto* v = std::get_if<T>(&i)) return *v;
    throw std::logic_error("revision_fsm: unexpected input at " + std::string(step));
}

// What every Stripe object of a move carries: its own key (what the search looks for), the original key it
// corrects, the revision, and the period's names.
stripe::metadata move_metadata(const billing_event& ev, const std::string& base,
                               const std::string& move_key) {
    return {{"billing_key", move_key},
            {"corrects", base},
            {"revision", std::to_string(ev.revision)},
            {"customer_id", ev.customer_id},
            {"billing_period", ev.billing_period}};
}

}  // namespace

std::string_view to_string(rop o) noexcept {
    static constexpr std::string_view names[] = {"admit",         "moves",           "record_attempt",
                                                 "move_done",     "move_ended",      "move_indeterminate",
                                                 "release",       "bump_generation", "finish",
                                                 "dead_letter",   "create_charge",   "create_refund",
                                                 "search_charge", "search_refund",   "done"};
    auto i = static_cast<std::size_t>(o);
    return i < std::size(names) ? names[i] : "?";
}

renew_command revision_fsm::renewal() const {
    if (at_ != at::call) throw std::logic_error("revision_fsm: a lease renewal with no call outstanding");
    return {lease_lost_, epoch_, move_.key_generation};
}

void revision_fsm::renewed(const in::renewed& r) {
    if (at_ != at::call) throw std::logic_error("revision_fsm: a lease renewal with no call outstanding");
    if (r.epoch)
        epoch_ = *r.epoch;
    else
        lease_lost_ = true;
}

revision_command revision_fsm::statement(rop what, std::string_view name, at next) {
    revision_command c;
    c.what = what;
    c.name = name;
    c.part = move_.part;
    c.generation = move_.key_generation;
    c.epoch = epoch_;
    step_name_ = name;
    at_ = next;
    return c;
}

revision_command revision_fsm::done(verdict v) {
    revision_command c;
    c.result = std::move(v);
    at_ = at::spent;
    return c;
}

revision_command revision_fsm::postgres_failed(const error& e) {
    auto c = done(on_postgres_error(cfg_->postgres_backoff, attempts_, e, step_name_));
    c.note = "postgres failed; requeueing: " + std::string(step_name_) + ": " + e.describe();
    c.warn = true;
    return c;
}

// A correction never gives up on a predecessor that has not arrived yet: that would move its money zero
// times.
revision_command revision_fsm::waiting(std::string detail) {
    auto base = std::min(cfg_->correction_wait_delay, cfg_->max_requeue_delay);
    auto jitter =
        std::chrono::milliseconds(static_cast<std::int64_t>(static_cast<double>(base.count()) * unit_ / 10));
    return done(verdict::requeue(verdict_reason::requeued_waiting,
                                 std::min(base + jitter, cfg_->max_requeue_delay), std::move(detail)));
}

// Every pending move in order; the revision is applied once none is left.
revision_command revision_fsm::next_move() {
    for (; index_ < moves_.size(); ++index_) {
        const auto& m = moves_[index_];
        if (m.status == "pending") {
            move_ = m;
            return run_move();
        }
        if (m.status != "done") {
            // Declined or failed: the revision ended with it, and a crash came before the revision was
            // marked.
            move_ = m;
            auto c = statement(rop::finish, "correction ended", at::ended_finish);
            c.status = m.status;
            c.text = "move " + std::to_string(m.part) + " " + m.status;
            then_ = verdict::finish(verdict_reason::duplicate_prevented, "move " + m.status);
            return c;
        }
    }
    return statement(rop::moves, "correction moves", at::applied_moves);
}

// One move: straight to Stripe under its key while that key is trusted, else the search first.
revision_command revision_fsm::run_move() {
    const auto& m = move_;
    const bool trusted =
        !m.indeterminate_since &&
        (!m.first_stripe_attempt_at || now_ - *m.first_stripe_attempt_at < cfg_->same_key_window);
    if (trusted) return statement(rop::record_attempt, "correction record attempt", at::attempt);
    revision_command c;
    if (m.refund) {
        c = statement(rop::search_refund, "correction search", at::search);
        c.refund_of = m.refund_of;
    } else {
        c = statement(rop::search_charge, "correction search", at::search);
        if (m.first_stripe_attempt_at)
            c.since = std::chrono::duration_cast<std::chrono::seconds>(
                          (*m.first_stripe_attempt_at - cfg_->search_slack).time_since_epoch())
                          .count();
    }
    c.move_key = m.key;
    return c;
}

revision_command revision_fsm::after_answer(const move_output& o, std::string object_id,
                                            std::string intent_id, std::string message) {
    revision_command c;
    switch (o.command) {
        case move_command::done:
            c = statement(rop::move_done, "correction move done", at::move_done);
            c.object_id = std::move(object_id);
            if (!intent_id.empty()) c.intent_id = std::move(intent_id);
            return c;
        case move_command::declined:
            c = statement(rop::move_ended, "correction move declined", at::move_declined);
            c.status = std::string(o.to);
            c.text = message;
            finish_status_ = std::string(o.revision_to);
            finish_text_ = message;
            then_ = verdict::finish(o.reason, std::move(message));
            return c;
        case move_command::failed_dead_letter: {
            // The dead letter first (a crash after it leaves the revision pending, and its redelivery gets
            // the same answer under the same key and finds the letter stored), then the move and the
            // revision.
            c = statement(rop::dead_letter, "dead letter", at::letter);
            c.text = std::string(o.letter);
            move_text_ = message;
            finish_text_ = std::string(o.letter) + ": " + message;
            then_ = verdict::finish(o.reason, finish_text_);
            c.note = "correction dead-lettered: " + finish_text_;
            c.warn = true;
            return c;
        }
        case move_command::release:
            c = statement(rop::release, "release lease", at::release_then);
            c.text = message;
            then_ = verdict::requeue(o.reason,
                                     o.reason == verdict_reason::requeued_retry_same_key
                                         ? cfg_->retry_same_key_delay
                                         : cfg_->stripe_unavailable_delay,
                                     std::move(message));
            return c;
        case move_command::indeterminate:
            break;
    }
    c = statement(rop::move_indeterminate, "correction indeterminate", at::release_then);
    c.text = message;
    then_ = verdict::requeue(verdict_reason::requeued_indeterminate, cfg_->indeterminate_delay,
                             std::move(message));
    return c;
}

revision_command revision_fsm::bump() {
    return statement(rop::bump_generation, "correction new key", at::bump);
}

// The search: the move's Stripe object by metadata[billing_key], read through the money machine.
revision_command revision_fsm::after_search(const revision_input& i) {
    if (const auto* f = std::get_if<in::failed>(&i)) {
        auto c = statement(rop::release, "release lease", at::release_then);
        c.text = "search failed: " + f->e.describe();
        then_ = verdict::requeue(verdict_reason::requeued_stripe_unavailable, cfg_->stripe_unavailable_delay,
                                 "correction search: " + f->e.describe());
        return c;
    }
    if (const auto* r = std::get_if<in::refund_found>(&i)) {
        if (!r->found ||
            on_found(table::move, stripe::read(*r->found, ev_.stripe_account)) == found_command::none)
            return bump();
        auto c = statement(rop::move_done, "correction move done", at::searched_done);
        c.object_id = r->found->id;
        c.note = "correction refund found at Stripe: " + r->found->id;
        return c;
    }
    const auto& f = expect<in::charge_found>(i, "search");
    if (!f.found) return bump();
    const auto& ch = *f.found;
    const std::string found_note = "correction charge found at Stripe: " + ch.id + " " + ch.status;
    // In flight (or a status the pinned API version does not define) waits; failed declines the revision;
    // only a charge that moved the money is the move done.
    const auto found_as = on_found(table::move, stripe::read(ch, ev_.stripe_account));
    revision_command c;
    if (found_as == found_command::mark_declined) {
        c = statement(rop::move_ended, "correction move declined", at::searched_declined);
        c.status = "declined";
        c.text = "charge " + ch.id + " failed";
        finish_status_ = "declined";
        finish_text_ = "charge " + ch.id + " failed: " + ch.failure_code;
        then_ = verdict::finish(verdict_reason::declined, "charge " + ch.id + " failed");
    } else if (found_as == found_command::mark_charged) {
        c = statement(rop::move_done, "correction move done", at::searched_done);
        c.object_id = ch.id;
        if (!ch.payment_intent.empty()) c.intent_id = ch.payment_intent;
    } else {
        c = statement(rop::release, "release lease", at::release_then);
        c.text = "charge " + ch.id + " is " + ch.status;
        then_ = verdict::requeue(verdict_reason::requeued_indeterminate, cfg_->indeterminate_delay, c.text);
    }
    c.note = found_note;
    return c;
}

revision_command revision_fsm::resume(const revision_input& i) {
    const auto* failed = std::get_if<in::failed>(&i);
    if (failed && at_ != at::start && at_ != at::search && at_ != at::call && at_ != at::spent)
        return postgres_failed(failed->e);
    switch (at_) {
        case at::start: {
            const auto& r = expect<in::revision>(i, "start");
            ev_ = r.ev;
            base_ = r.base;
            key_ = r.key;
            attempts_ = r.attempts;
            unit_ = r.unit;
            return statement(rop::admit, "correction admit", at::admit);
        }
        case at::admit: {
            const auto& a = expect<in::admitted>(i, "admit");
            const auto& act = a.action;
            if (act == "wait_original") return waiting("waiting for the original charge: " + a.detail);
            if (act == "wait_predecessor") return waiting("waiting for revision " + a.detail);
            if (act == "lease_held")
                return done(verdict::requeue(
                    verdict_reason::requeued_lease_held,
                    lease_held_requeue_delay(a.lease_remaining, cfg_->lease, cfg_->lease_held_delay,
                                             cfg_->max_requeue_delay, unit_),
                    "correction " + a.detail));
            if (act == "final")
                return done(verdict::finish(verdict_reason::duplicate_prevented,
                                            "revision " + a.detail + " already"));
            if (act == "superseded" || act == "applied_zero" || act == "original_declined")
                return done(verdict::finish(verdict_reason::correction_noop, act + ": " + a.detail));
            if (act == "conflict") {
                // As for the original charge: the recorded revision stays as it is and a human decides.
                auto c = statement(rop::dead_letter, "dead letter", at::conflict_letter);
                c.text = "conflict";
                c.note = "correction conflicts with the ledger: " + a.detail;
                c.warn = true;
                return c;
            }
            if (act != "run") throw std::logic_error("cg_correction_admit: unknown action " + act);
            epoch_ = a.epoch;
            delta_ = a.delta;
            return statement(rop::moves, "correction moves", at::moves);
        }
        case at::conflict_letter:
            expect<in::applied>(i, "dead letter");
            return done(verdict::finish(verdict_reason::dead_lettered, "conflict"));
        case at::moves: {
            const auto& m = expect<in::moves>(i, "moves");
            moves_ = m.list;
            now_ = m.now;
            index_ = 0;
            return next_move();
        }
        case at::ended_finish:
        case at::applied_finish:
        case at::release_then:
        case at::searched_declined_finish:
        case at::move_declined_finish:
        case at::letter_finish:
            expect<in::applied>(i, "finish");
            return done(std::move(then_));
        case at::applied_moves: {
            std::string ids;
            for (const auto& m : expect<in::moves>(i, "moves").list)
                ids += (ids.empty() ? "" : ",") + (m.stripe_object_id.empty() ? "?" : m.stripe_object_id);
            auto c = statement(rop::finish, "correction applied", at::applied_finish);
            c.status = "applied";
            then_ = verdict::finish(delta_ > 0 ? verdict_reason::charged : verdict_reason::refunded, ids);
            c.note = "correction applied: " + std::to_string(delta_) + " cents: " + ids;
            return c;
        }
        case at::search:
            return after_search(i);
        case at::searched_done:
            // Found made at Stripe: the moves are read again, as after a redelivery.
            expect<in::applied>(i, "move done");
            return statement(rop::moves, "correction moves", at::moves);
        case at::searched_declined:
        case at::move_declined: {
            expect<in::applied>(i, "move declined");
            auto c =
                statement(rop::finish, "correction declined",
                          at_ == at::move_declined ? at::move_declined_finish : at::searched_declined_finish);
            c.status = finish_status_;
            c.text = finish_text_;
            return c;
        }
        case at::bump: {
            const auto& b = expect<in::bumped>(i, "new key");
            if (!b.generation) {
                auto c = statement(rop::release, "release lease", at::release_then);
                c.text = "waiting for quiet before a new key";
                then_ =
                    verdict::requeue(verdict_reason::requeued_indeterminate,
                                     std::max(cfg_->indeterminate_delay, cfg_->new_key_quiet / 10), c.text);
                return c;
            }
            // Nothing at Stripe under the key and no call under it can still land: a new generation.
            move_.key_generation += 1;
            move_.first_stripe_attempt_at.reset();
            move_.indeterminate_since.reset();
            return run_move();
        }
        case at::attempt: {
            const auto& l = expect<in::leased>(i, "record attempt");
            if (!l.epoch)
                return done(verdict::requeue(verdict_reason::requeued_lease_lost, cfg_->lease_held_delay,
                                             "correction"));
            epoch_ = *l.epoch;
            lease_lost_ = false;
            const auto idem = stripe_idempotency_key(move_.key, move_.key_generation);
            revision_command c;
            if (move_.refund) {
                c = statement(rop::create_refund, "correction call", at::call);
                c.refund_of = move_.refund_of;
                c.amount_cents = move_.amount_cents;
                c.idempotency_key = idem;
                c.metadata = move_metadata(ev_, base_, move_.key);
                return c;
            }
            c = statement(rop::create_charge, "correction call", at::call);
            billing_event charge_ev = ev_;
            charge_ev.amount_cents = move_.amount_cents;
            c.request = build_request(charge_ev, move_.key, move_.key_generation);
            std::visit([&](auto& r) { r.metadata = move_metadata(ev_, base_, move_.key); }, c.request);
            return c;
        }
        case at::call: {
            if (const auto* a = std::get_if<in::answer>(&i)) {
                // In flight (a bank debit) or no charge id: not settled, followed up by the search later.
                return after_answer(on_move_answer(a->out), a->out.charge_id, a->out.payment_intent_id,
                                    a->out.message);
            }
            const auto& r = expect<in::refund_answer>(i, "call");
            std::string id, status;
            if (r.refund) {
                id = r.refund->id;
                status = r.refund->status;
            }
            return after_answer(on_refund_answer(r.cls, status), std::move(id), {}, r.message);
        }
        case at::move_done:
            expect<in::applied>(i, "move done");
            ++index_;
            return next_move();
        case at::letter: {
            expect<in::applied>(i, "dead letter");
            auto c = statement(rop::move_ended, "correction move failed", at::letter_ended);
            c.status = "failed";
            c.text = move_text_;
            return c;
        }
        case at::letter_ended: {
            expect<in::applied>(i, "move failed");
            auto c = statement(rop::finish, "correction failed", at::letter_finish);
            c.status = "failed";
            c.text = finish_text_;
            return c;
        }
        case at::spent:
            break;
    }
    throw std::logic_error("revision_fsm: resumed after done");
}

}  // namespace cg::billing::machine
