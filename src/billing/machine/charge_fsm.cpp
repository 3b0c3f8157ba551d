#include "billing/machine/charge_fsm.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "billing/machine/key.hpp"
#include "stripe/fact.hpp"

namespace cg::billing::machine {
namespace {

std::string invalid_reason(const error& e) {
    // "event field is invalid: amount_cents: must be an integer in 1..99999999"
    std::string out = e.code.message();
    if (!e.message.empty()) out += ": " + e.message;
    return out;
}

std::int64_t unix_seconds(sys_time t) {
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

template <class T>
const T& want(const fsm_input& i, std::string_view step) {
    if (const auto* v = std::get_if<T>(&i)) return *v;
    throw std::logic_error("charge_fsm: unexpected input at " + std::string(step));
}

}  // namespace

std::string_view to_string(op o) noexcept {
    switch (o) {
        case op::preflight:
            return "preflight";
        case op::find:
            return "find";
        case op::take_lease:
            return "take_lease";
        case op::record_attempt:
            return "record_attempt";
        case op::superseded_payments:
            return "superseded_payments";
        case op::bump_generation:
            return "bump_generation";
        case op::settle:
            return "settle";
        case op::apply_recorded:
            return "apply_recorded";
        case op::dead_letter:
            return "dead_letter";
        case op::create:
            return "create";
        case op::search_charges:
            return "search_charges";
        case op::search_intents:
            return "search_intents";
        case op::pause:
            return "pause";
        case op::correction:
            return "correction";
        case op::done:
            return "done";
    }
    return "?";
}

bool superseded_failure(const stripe::fact& found, std::int64_t created,
                        const std::vector<std::string>& superseded,
                        std::optional<sys_time> first_attempt) noexcept {
    const auto m = found.moved;
    if (m != stripe::movement::failed && m != stripe::movement::needs_customer &&
        m != stripe::movement::canceled)
        return false;
    if (std::find(superseded.begin(), superseded.end(), found.id) != superseded.end()) return true;
    return first_attempt && created < unix_seconds(*first_attempt) - 300;
}

renew_command charge_fsm::renewal() const {
    if (at_ != at::create) throw std::logic_error("charge_fsm: a lease renewal with no call outstanding");
    return {lease_lost_, lease_, gen_};
}

void charge_fsm::renewed(const in::renewed& r) {
    if (at_ != at::create) throw std::logic_error("charge_fsm: a lease renewal with no call outstanding");
    if (r.epoch)
        lease_ = *r.epoch;
    else
        lease_lost_ = true;
}

command charge_fsm::emit(command&& c, at next) {
    at_ = next;
    if (c.what != op::done && c.what != op::pause) step_name_ = c.name;
    return std::move(c);
}

command charge_fsm::finish(verdict v) {
    command c;
    c.what = op::done;
    c.result = std::move(v);
    c.journal = std::move(journal_);
    journal_.reset();
    if (cfg_->step_pauses && delivered_) {  // between the ledger update and FIN
        parked_ = std::move(c);
        command p;
        p.what = op::pause;
        return emit(std::move(p), at::pause_then_done);
    }
    return emit(std::move(c), at::spent);
}

command charge_fsm::postgres_failed(const error& e) {
    auto c = finish(on_postgres_error(cfg_->postgres_backoff, attempts_, e, step_name_));
    command& done = c.what == op::done ? c : *parked_;
    done.note = "postgres failed; requeueing: " + std::string(step_name_) + ": " + e.describe();
    done.warn = true;
    done.journal.reset();
    return c;
}

command charge_fsm::lease_held(std::optional<std::chrono::milliseconds> remaining, std::string detail) {
    auto delay = lease_held_requeue_delay(remaining, cfg_->lease, cfg_->lease_held_delay,
                                          cfg_->max_requeue_delay, unit_);
    return finish(verdict::requeue(verdict_reason::requeued_lease_held, delay, std::move(detail)));
}

command charge_fsm::dead_letter(std::string reason, std::optional<std::string> key) {
    command c;
    c.what = op::dead_letter;
    c.name = "dead letter";
    c.letter_key = std::move(key);
    c.text = reason;
    then_ = verdict::finish(verdict_reason::dead_lettered, std::move(reason));
    return emit(std::move(c), at::dead_letter);
}

command charge_fsm::settle(charge_step s, std::string_view name, verdict then) {
    command c;
    c.what = op::settle;
    c.step = s;
    c.name = name;
    then_ = std::move(then);
    return emit(std::move(c), at::settle);
}

command charge_fsm::release(std::string why, verdict then) {
    auto c = settle(charge_step::release_requeue, "release lease", std::move(then));
    c.text = std::move(why);
    at_ = at::release;
    return c;
}

command charge_fsm::resume(const fsm_input& i) {
    switch (at_) {
        case at::start: {
            if (const auto* s = std::get_if<in::swept>(&i)) {
                ev_ = s->ev;
                parsed_ = true;
                key_ = base_key(cfg_->key_namespace, ev_.customer_id, ev_.billing_period, ev_.stripe_account);
                attempts_ = s->attempts;
                unit_ = s->unit;
                return on_existing(s->rec, s->now);
            }
            const auto& d = want<in::delivery>(i, "start");
            delivered_ = true;
            attempts_ = d.attempts;
            unit_ = d.unit;
            auto ev = parse_event(d.body);
            if (!ev) return dead_letter(invalid_reason(ev.err()), std::nullopt);
            ev_ = std::move(*ev);
            parsed_ = true;
            key_ = base_key(cfg_->key_namespace, ev_.customer_id, ev_.billing_period, ev_.stripe_account);
            // A correction (revision > 0) is a job of its own, keyed from the original's key.
            if (ev_.is_correction()) {
                command c;
                c.what = op::correction;
                return emit(std::move(c), at::correction);
            }
            command c;
            c.what = op::preflight;
            c.name = "pre-flight";
            return emit(std::move(c), at::preflight);
        }
        case at::correction:
            return finish(want<in::corrected>(i, "correction").v);
        case at::dead_letter: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            auto c = finish(std::move(then_));
            if (!want<in::applied>(i, "dead letter").changed) {
                command& done = c.what == op::done ? c : *parked_;
                done.note = "dead letter already stored for this message";
            }
            return c;
        }
        case at::preflight: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const auto& p = want<in::preflighted>(i, "pre-flight");
            if (!p.inserted) return on_existing(p.record, p.now);
            // The insert recorded the first attempt too: straight to Stripe.
            lease_ = p.record.lease_epoch;
            attempt_lease_ = lease_;
            gen_ = p.record.key_generation;
            first_attempt_ = p.record.first_stripe_attempt_at;
            if (cfg_->step_pauses) {  // between the row and the Stripe call
                command c;
                c.what = op::pause;
                return emit(std::move(c), at::pause_then_create);
            }
            return create();
        }
        case at::pause_then_create:
            want<in::resumed>(i, "pause");
            return create();
        case at::pause_then_done: {
            want<in::resumed>(i, "pause");
            auto c = std::move(*parked_);
            parked_.reset();
            return emit(std::move(c), at::spent);
        }
        case at::take: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const auto& r = want<in::row>(i, "take lease");
            if (!r.rec) {
                // Another worker took it first (or settled it): wait for its lease, by a fresh read of the
                // row.
                command c;
                c.what = op::find;
                c.name = "find";
                return emit(std::move(c), at::find);
            }
            const auto& rec = *r.rec;
            lease_ = rec.lease_epoch;
            attempt_lease_ = lease_;
            gen_ = rec.key_generation;
            first_attempt_ = rec.first_stripe_attempt_at;
            auto action = recovery_mode(rec, r.now, cfg_->same_key_window);
            // Anything but "same key is safe" searches first: searching is never wrong, only slower.
            auto c = action == existing_action::recover_same_key ? record_attempt() : start_search();
            c.note = "recovering a pending billing record: " + std::string(billing::to_string(action)) +
                     ", generation " + std::to_string(rec.key_generation) + ", stripe attempts " +
                     std::to_string(rec.stripe_attempts);
            return c;
        }
        case at::find: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const auto& r = want<in::row>(i, "find");
            if (r.rec && is_final(r.rec->status))
                return finish(verdict::finish(verdict_reason::duplicate_prevented,
                                              std::string(billing::to_string(r.rec->status))));
            std::optional<std::chrono::milliseconds> remaining;
            if (r.rec) remaining = r.rec->lease_remaining;
            return lease_held(remaining, "lease taken by another worker");
        }
        case at::attempt: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const auto& a = want<in::attempted>(i, "record attempt");
            if (!a.generation)
                return finish(verdict::requeue(verdict_reason::requeued_lease_lost, cfg_->lease_held_delay,
                                               "record attempt"));
            lease_ = a.lease;
            gen_ = *a.generation;
            return create();
        }
        case at::superseded: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            superseded_ = want<in::superseded>(i, "read retries").ids;
            superseded_read_ = true;
            return search_charges();
        }
        case at::charges:
        case at::intents: {
            if (const auto* f = std::get_if<in::failed>(&i)) {
                // Without an answer from the search nothing may be charged: give the row back for a later
                // try.
                auto why = f->e.describe();
                auto c = release("charge search failed: " + why,
                                 verdict::requeue(verdict_reason::requeued_stripe_unavailable,
                                                  cfg_->stripe_unavailable_delay, why));
                at_ = at::search_release;
                return c;
            }
            if (at_ == at::charges) return after_charges(want<in::charge_found>(i, "search").found);
            return after_intents(want<in::intent_found>(i, "search").found);
        }
        case at::search_release: {
            auto c = finish(std::move(then_));
            if (const auto* f = std::get_if<in::failed>(&i)) {
                command& done = c.what == op::done ? c : *parked_;
                done.note = "could not release the lease: " + f->e.describe();
                done.warn = true;
            }
            return c;
        }
        case at::bump: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const auto& b = want<in::bumped>(i, "bump generation");
            if (!b.generation && b.wait.count() > 0) {
                // A call under this key showed life too recently: it may still charge. Look again once it
                // cannot.
                std::string why =
                    "no charge carries the key yet, but a call under it showed life less than " +
                    std::to_string(cfg_->new_key_quiet.count() / 1000) + " s ago";
                auto delay =
                    std::min(std::max(b.wait + std::chrono::milliseconds(100), cfg_->indeterminate_delay),
                             cfg_->max_requeue_delay);
                auto c = release(why, verdict::requeue(verdict_reason::requeued_indeterminate, delay, why));
                c.note = "waiting out the previous call before a new key generation: " +
                         std::to_string(b.wait.count()) + " ms";
                return c;
            }
            if (!b.generation)
                return finish(verdict::requeue(verdict_reason::requeued_lease_lost, cfg_->lease_held_delay,
                                               "bump generation"));
            gen_ = *b.generation;
            auto c = record_attempt();
            c.note = "no charge carries the key: charging under a new key generation " + std::to_string(gen_);
            c.warn = true;
            return c;
        }
        case at::create:
            return after_create(want<in::answer>(i, "create").out);
        case at::answer_superseded: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            superseded_ = want<in::superseded>(i, "read retries").ids;
            superseded_read_ = true;
            auto out = std::move(*answer_);
            answer_.reset();
            return after_superseded(out);
        }
        case at::answer_pause: {
            want<in::resumed>(i, "pause");
            auto c = std::move(*parked_);
            parked_.reset();
            at_ = answer_next_;
            return c;
        }
        case at::settle:
        case at::release: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            const bool changed = want<in::applied>(i, "settle").changed;
            if (!changed) journal_.reset();
            auto c = finish(std::move(then_));
            if (!changed && !not_changed_.empty()) {
                command& done = c.what == op::done ? c : *parked_;
                done.note = std::move(not_changed_);
                done.warn = true;
            }
            not_changed_.clear();
            return c;
        }
        case at::processing: {
            if (const auto* f = std::get_if<in::failed>(&i)) return postgres_failed(f->e);
            command c;
            c.what = op::apply_recorded;
            c.name = "apply recorded events";
            if (!want<in::applied>(i, "mark processing").changed) {
                c.note = std::move(not_changed_);
                c.warn = true;
            }
            not_changed_.clear();
            return emit(std::move(c), at::apply_recorded);
        }
        case at::apply_recorded:
            // The row is durably processing: events not applied now are applied by the poll. Not a reason to
            // requeue.
            if (!std::holds_alternative<in::failed>(i)) want<in::applied>(i, "apply recorded events");
            return finish(std::move(then_));
        case at::spent:
            break;
    }
    throw std::logic_error("charge_fsm: resumed after done");
}

}  // namespace cg::billing::machine
