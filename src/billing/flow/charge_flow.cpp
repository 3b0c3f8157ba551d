#include "billing/flow/charge_flow.hpp"

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <stdexcept>

#include "billing/flow/charge_flow_run.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "net/turn_budget.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {
namespace {

std::string invalid_reason(const error& e) {
    // "event field is invalid: amount_cents: must be an integer in 1..99999999"
    std::string out = e.code.message();
    if (!e.message.empty()) out += ": " + e.message;
    return out;
}

// The ledger's in-flight note as a lease renewal takes it (lease_renewal::note_in_flight).
net::awaitable<result<void>> note_in_flight(billing::ledger& ledger, std::string key,
                                            std::int32_t generation) {
    auto noted = co_await ledger.note_in_flight(std::move(key), generation);
    if (!noted) co_return noted.err();
    co_return result<void>{};
}

std::optional<std::string> intent_of(const stripe::charge_outcome& out) {
    if (out.payment_intent_id.empty()) return std::nullopt;
    return out.payment_intent_id;
}

}  // namespace

charge_flow::charge_flow(charge_flow_config cfg, billing::ledger& ledger, stripe::client& stripe, logger log,
                         metrics::registry* reg)
    : cfg_(std::move(cfg)),
      ledger_(ledger),
      stripe_(stripe),
      log_(std::move(log)),
      metrics_(reg ? std::make_unique<metrics_set>(*reg) : nullptr),
      settlements_(std::make_unique<settlement_store>(ledger.pool())) {
    corrections_ = std::make_unique<billing::corrections>(cfg_, ledger_, stripe_);
    if (metrics_) corrections_->count_lease_lost_in(metrics_->lease_lost);
    if (!valid_key_namespace(cfg_.key_namespace)) throw std::invalid_argument("invalid key namespace");
    if (cfg_.lease_renew_interval <= std::chrono::milliseconds(0) || cfg_.lease_renew_interval >= cfg_.lease)
        throw std::invalid_argument("lease_renew_interval must be positive and shorter than the lease");
}

charge_flow::~charge_flow() = default;

verdict charge_flow::count(verdict v) {
    if (metrics_) metrics_->outcomes[static_cast<std::size_t>(v.reason)]->Increment();
    return v;
}

// handle() and give_up() are the one coroutine (one frame per delivery fewer than a coroutine each).
net::awaitable<verdict> charge_flow::handle(delivery d, touch_fn touch) {
    return handle_delivery(std::move(d), std::move(touch), false);
}

net::awaitable<verdict> charge_flow::give_up(delivery d, touch_fn touch) {
    return handle_delivery(std::move(d), std::move(touch), true);
}

net::awaitable<verdict> charge_flow::resume(delivery d, billing_event ev, ledger_record rec) {
    run r(std::move(d), {}, log_);
    r.ev = std::move(ev);
    r.key = base_key(cfg_.key_namespace, r.ev.customer_id, r.ev.billing_period, r.ev.stripe_account);
    if (r.key != rec.key)
        throw std::invalid_argument("resume: row " + rec.key + " is not this pipeline's key");
    r.log.add(run::delivery_log::context::swept);
    co_return co_await on_existing(r, rec);
}

net::awaitable<verdict> charge_flow::resume_correction(delivery d, billing_event ev, std::string base) {
    run r(std::move(d), {}, log_);
    r.ev = std::move(ev);
    r.key = base_key(cfg_.key_namespace, r.ev.customer_id, r.ev.billing_period, r.ev.stripe_account);
    if (!r.ev.is_correction() || r.key != base)
        throw std::invalid_argument("resume_correction: revision of " + base + " is not this pipeline's");
    r.log.add(run::delivery_log::context::swept);
    co_return co_await corrections_->handle(r.d, {}, r.ev, r.key, r.log);
}

net::awaitable<verdict> charge_flow::handle_delivery(delivery d, touch_fn touch, bool past_max_attempts) {
    run r(std::move(d), std::move(touch), log_);
    if (past_max_attempts) {
        if (metrics_) metrics_->past_max_attempts->Increment();
        r.log.error(
            "message past max attempts: still processed, never dropped while the ledger can settle it");
    }
    // Debug lines mark each step of a delivery (received, row written, Stripe called, Stripe answered, then
    // the verdict): enough to tell, after a crash, which step a delivery had reached.
    r.log.debug("billing delivery received");
    auto v = co_await process(r);
    if (cfg_.test_step_pause.count() > 0) co_await test_pause();  // between the ledger update and FIN
    // A decline, a dead letter or a blocked charge is finished but wants a person (a retry once the card is
    // fixed, a replay or a dismissal): warn, as a requeue is.
    const bool needs_a_person =
        v.reason == verdict_reason::declined || v.reason == verdict_reason::needs_authentication ||
        v.reason == verdict_reason::dead_lettered || v.reason == verdict_reason::cap_blocked;
    auto level = past_max_attempts && !v.finished() ? log_level::error
                 : v.finished() && !needs_a_person  ? log_level::info
                                                    : log_level::warn;
    r.log.log(
        level, v.finished() ? "billing message finished" : "billing message requeued",
        std::array<log_field, 4>{log_field("reason", to_string(v.reason)), log_field("detail", v.detail),
                                 log_field("delay_ms", static_cast<std::int64_t>(v.delay.count())),
                                 log_field("past_max_attempts", past_max_attempts)});
    co_return count(std::move(v));
}

// parse → pre-flight → CHARGE for a new row, or the decision table for an existing one.
net::awaitable<verdict> charge_flow::process(run& r) {
    auto ev = parse_event(r.d.body);
    if (!ev) co_return co_await dead_letter_finish(r, invalid_reason(ev.err()), std::nullopt);
    r.ev = std::move(*ev);
    r.key = base_key(cfg_.key_namespace, r.ev.customer_id, r.ev.billing_period, r.ev.stripe_account);
    r.log.add(run::delivery_log::context::event);
    // A correction (revision > 0) is a job of its own, keyed from the original's key.
    if (r.ev.is_correction()) co_return co_await corrections_->handle(r.d, r.touch, r.ev, r.key, r.log);

    new_record row{r.key, r.ev, r.d.message_id, r.d.attempts, cfg_.key_namespace};
    auto pf = co_await ledger_.preflight(std::move(row), cfg_.lease);
    if (!pf) co_return postgres_failed(r, pf.err(), "pre-flight");
    if (pf->inserted) {
        r.log.debug("ledger row written");
        co_await test_pause();  // between the row and the Stripe call
        // The insert recorded the first attempt too (ledger.cpp): straight to Stripe.
        r.lease = pf->record.lease_epoch;
        r.generation = pf->record.key_generation;
        r.first_attempt = pf->record.first_stripe_attempt_at;
        co_return co_await charge(r, true);
    }
    // A row already final with this event's payload — every delivery of a replay — is a duplicate: finished
    // here, without on_existing's coroutine (which decides the same).
    const auto& rec = pf->record;
    if (rec.key == r.key &&
        decide_existing(rec, r.ev, cfg_.now(), cfg_.same_key_window) == existing_action::duplicate_finish)
        co_return verdict::finish(verdict_reason::duplicate_prevented, std::string(to_string(rec.status)));
    co_return co_await on_existing(r, rec);
}

net::awaitable<void> charge_flow::test_pause() {
    if (cfg_.test_step_pause.count() <= 0) co_return;
    auto ms = std::uniform_int_distribution<std::int64_t>(0, cfg_.test_step_pause.count())(rng_);
    net::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
    co_await t.async_wait();
}

verdict charge_flow::lease_held(std::optional<std::chrono::milliseconds> remaining, std::string detail) {
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    auto delay =
        lease_held_requeue_delay(remaining, cfg_.lease, cfg_.lease_held_delay, cfg_.max_requeue_delay, unit);
    return verdict::requeue(verdict_reason::requeued_lease_held, delay, std::move(detail));
}

net::awaitable<verdict> charge_flow::on_existing(run& r, const ledger_record& rec) {
    // Same customer and period under another key (another key namespace produced it): never a second charge.
    if (rec.key != r.key) {
        r.log.warn("customer and period already recorded under another key", {{"other_key", rec.key}});
        co_return co_await dead_letter_finish(r, "conflict", rec.key);
    }
    switch (decide_existing(rec, r.ev, cfg_.now(), cfg_.same_key_window)) {
        case existing_action::duplicate_finish:
            co_return verdict::finish(verdict_reason::duplicate_prevented,
                                      std::string(to_string(rec.status)));
        case existing_action::payload_conflict:
            // The recorded row stays as it is: a human decides which amount is right.
            co_return co_await dead_letter_finish(r, "conflict", r.key);
        case existing_action::lease_held_requeue:
            co_return lease_held(rec.lease_remaining);
        case existing_action::recover_same_key:
        case existing_action::recover_search:
            co_return co_await recover(r);
    }
    throw std::logic_error("unknown existing_action");
}

// CHARGE: record the attempt (and renew the lease) before Stripe hears of it — unless the pre-flight insert
// already did; call Stripe while the lease is kept alive; map the outcome onto the ledger.
net::awaitable<verdict> charge_flow::charge(run& r, bool attempt_recorded) {
    // The first epoch of the lease this delivery holds: its pre-flight's, or its take's (set by recover()).
    if (r.attempt_lease == 0) r.attempt_lease = r.lease;
    if (!attempt_recorded) {
        auto att = co_await ledger_.record_attempt(r.key, r.lease, cfg_.lease);
        if (!att) co_return postgres_failed(r, att.err(), "record attempt");
        if (!*att)
            co_return verdict::requeue(verdict_reason::requeued_lease_lost, cfg_.lease_held_delay,
                                       "record attempt");
        r.lease = (*att)->lease;
        r.generation = (*att)->key_generation;
    }

    stripe::charge_outcome out;
    auto ex = co_await asio::this_coro::executor;
    auto keeper = std::make_shared<lease_keeper>(
        ex, cfg_.lease_renew_interval, [this, &r](lease_keeper& k) { return renew_once(r, k); }, r.log);
    auto began = std::chrono::steady_clock::now();
    r.log.debug("calling Stripe", {{"generation", r.generation}});
    // The call is awaited here, the lease kept by a timer beside it (lease_keeper). A delivery waits for its
    // turn among the client's calls before it builds its request: meanwhile it holds this frame and a
    // timer, neither the request nor the client's coroutines.
    keeper->start();
    std::exception_ptr failed;
    try {
        auto turn = co_await stripe_.turn();
        auto req = build_request(r.ev, r.key, r.generation);
        auto* intent = std::get_if<stripe::payment_intent_request>(&req);
        // One awaitable, one result slot in this frame (a co_await per branch would give each its own).
        auto call =
            intent ? stripe_.create_payment_intent(std::move(*intent), std::move(turn))
                   : stripe_.create_charge(std::move(std::get<stripe::charge_request>(req)), std::move(turn));
        out = co_await std::move(call);
    } catch (...) {
        failed = std::current_exception();
    }
    co_await keeper->stop();
    if (failed) std::rethrow_exception(failed);
    r.log.debug("Stripe answered", {{"outcome", stripe::to_string(out.cls)}, {"charge_id", out.charge_id}});
    co_await test_pause();  // between Stripe's answer and the ledger update
    auto took = std::chrono::steady_clock::now() - began;
    // Answers to calls made together come back together: past the loop's turn budget the settlement
    // starts on the next turn, behind sockets and timers (net/turn_budget.hpp).
    if (!turns_) turns_ = &net::turn_budget::of(ex);
    if (turns_->spent()) co_await turns_->next_turn();
    note_stripe_time(took);
    if (metrics_) metrics_->stripe_duration->Observe(std::chrono::duration<double>(took).count());
    co_return co_await settle(r, out);
}

// The group-commit wait follows Stripe's pace: 1 % of the average call time, capped (charge_flow_config).
void charge_flow::note_stripe_time(std::chrono::steady_clock::duration took) {
    double us = std::chrono::duration<double, std::micro>(took).count();
    stripe_time_avg_us_ += (us - stripe_time_avg_us_) / 16.0;
    auto cap = static_cast<double>(cfg_.group_commit_linger_max.count());
    ledger_.set_linger(
        std::chrono::microseconds(static_cast<std::int64_t>(std::min(cap, stripe_time_avg_us_ / 100.0))));
}

// One renewal while Stripe is awaited (lease_keeper): tell the transport we are alive and extend the lease,
// so a redelivery elsewhere sees "lease held" instead of recovering a row whose call is still in flight.
net::awaitable<void> charge_flow::renew_once(run& r, lease_keeper& k) {
    lease_renewal how{
        r.touch, [this, &r](std::int64_t epoch) { return ledger_.renew_lease(r.key, epoch, cfg_.lease); },
        [this, &r] { return note_in_flight(ledger_, r.key, r.generation); },
        metrics_ ? metrics_->lease_lost : nullptr, "row"};
    co_await billing::renew_once(k, how, r.lease, r.log);
}

// The answer as the money machine reads it (machine.hpp); this runs its ledger command.
net::awaitable<verdict> charge_flow::settle(run& r, const stripe::charge_outcome& out) {
    const auto o = machine::on_answer(out);
    switch (o.command) {
        case charge_step::mark_processing: {
            std::optional<std::string> id;
            if (!out.charge_id.empty()) id = out.charge_id;
            co_return co_await leave_processing(r, id, intent_of(out), out.in_flight_status);
        }
        case charge_step::mark_charged: {
            auto m = co_await ledger_.mark_charged(r.key, out.charge_id, intent_of(out));
            if (!m) co_return postgres_failed(r, m.err(), "mark charged");
            if (!*m)
                r.log.warn("row already settled by another worker", {{"charge_id", out.charge_id}});
            else
                journal_.note({r.key, r.generation, r.attempt_lease, r.lease, record_status::charged,
                               out.charge_id, intent_of(out), std::nullopt,
                               std::chrono::steady_clock::now()});
            co_return verdict::finish(o.reason, out.charge_id);
        }
        case charge_step::mark_declined: {
            std::optional<std::string> id;
            if (!out.charge_id.empty()) id = out.charge_id;
            auto m = co_await ledger_.mark_declined(r.key, id, out.message, intent_of(out));
            if (!m) co_return postgres_failed(r, m.err(), "mark declined");
            if (*m)
                journal_.note({r.key, r.generation, r.attempt_lease, r.lease, record_status::declined, id,
                               intent_of(out), out.message, std::chrono::steady_clock::now()});
            co_return verdict::finish(o.reason, out.message);
        }
        case charge_step::mark_cap_blocked: {
            // With a dead letter: once the cap is raised (or the spend behind it explained), replaying the
            // letter reopens the row and charges it (dead-letters replay).
            auto m =
                co_await ledger_.mark_cap_blocked(r.key, out.message, r.letter(std::string(o.letter), r.key));
            if (!m) co_return postgres_failed(r, m.err(), "mark cap_blocked");
            r.log.warn("alert: spend cap exceeded, charge blocked",
                       {{"alert", true}, {"stripe", out.message}});
            co_return verdict::finish(o.reason, out.message);
        }
        case charge_step::mark_conflict_dead_letter: {
            auto m =
                co_await ledger_.mark_conflict(r.key, out.message, r.letter(std::string(o.letter), r.key));
            if (!m) co_return postgres_failed(r, m.err(), "mark conflict");
            co_return verdict::finish(o.reason, std::string(o.letter) + ": " + out.message);
        }
        case charge_step::mark_failed_dead_letter: {
            auto m = co_await ledger_.mark_failed(r.key, out.message, r.letter(std::string(o.letter), r.key));
            if (!m) co_return postgres_failed(r, m.err(), "mark failed");
            co_return verdict::finish(o.reason, std::string(o.letter) + ": " + out.message);
        }
        case charge_step::release_requeue: {
            auto m = co_await ledger_.release_lease(r.key, r.lease, out.message);
            if (!m) co_return postgres_failed(r, m.err(), "release lease");
            co_return verdict::requeue(o.reason, cfg_.retry_same_key_delay, out.message);
        }
        case charge_step::setup_requeue: {
            // Our key, its permissions or the address are wrong (or something in front of Stripe refused):
            // nothing happened, and the event is as valid as before. Keep it until an operator fixes it.
            auto m = co_await ledger_.release_lease(r.key, r.lease, out.message);
            if (!m) co_return postgres_failed(r, m.err(), "release lease");
            r.log.error(
                "alert: Stripe refused the request for our setup (API key, permissions or address); "
                "the event stays pending and is retried",
                {{"alert", true}, {"stripe", out.message}});
            co_return verdict::requeue(o.reason, cfg_.stripe_unavailable_delay, out.message);
        }
        case charge_step::mark_indeterminate_requeue: {
            auto m = co_await ledger_.mark_indeterminate(r.key, r.lease, out.message);
            if (!m) co_return postgres_failed(r, m.err(), "mark indeterminate");
            co_return verdict::requeue(o.reason, cfg_.indeterminate_delay, out.message);
        }
    }
    throw std::logic_error("unknown charge_step");
}

// Stripe answered, the money has not moved: the row goes processing (durably, with the delivery a later
// failure's dead letter needs) and the message is finished; a webhook or the poll of rows left processing
// follows the payment to its end. Events Stripe delivered before this answer (a payment_failed can overtake
// the create call's response) were recorded against the pending row: they are applied now.
// requires_capture is an anomaly — chargeguard never asks for manual capture — and is not a charge either:
// the authorisation is kept as processing (someone may still capture it; if nobody does it lapses, Stripe
// cancels it, and the row fails after processing with a dead letter whose replay charges again), so the
// event is neither counted as paid nor charged a second time beside a live authorisation.
net::awaitable<verdict> charge_flow::leave_processing(run& r, std::optional<std::string> charge_id,
                                                      std::optional<std::string> payment_intent_id,
                                                      std::string status) {
    if (stripe::intent_movement(status) == stripe::movement::authorised) {
        if (metrics_) metrics_->requires_capture->Increment();
        r.log.error(
            "alert: Stripe left the payment intent requires_capture, an authorisation chargeguard never "
            "asks for; recorded as processing, not charged",
            {{"alert", true}, {"payment_intent", payment_intent_id.value_or("")}});
    }
    auto m = co_await ledger_.mark_processing(r.key, charge_id, payment_intent_id, status,
                                              r.letter(std::string(failed_after_processing_reason), r.key));
    if (!m) co_return postgres_failed(r, m.err(), "mark processing");
    if (!*m)
        r.log.warn("row already settled by another worker",
                   {{"payment_intent", payment_intent_id.value_or("")}});
    r.log.info("payment processing: the row waits for Stripe's final answer",
               {{"status", status},
                {"payment_intent", payment_intent_id.value_or("")},
                {"charge_id", charge_id.value_or("")}});
    auto applied = co_await settlements_->apply_recorded(r.key);
    if (!applied) {
        // The row is durably processing: the poll applies these events later. Not a reason to requeue.
        r.log.warn("could not apply the events recorded for the row yet",
                   {{"error", applied.err().describe()}});
    } else if (*applied && (*applied)->failed_now) {
        if (metrics_) metrics_->failed_after_processing->Increment();
        r.log.error("alert: payment failed after processing; dead-lettered, replay charges again",
                    {{"alert", true}, {"reason", (*applied)->note}});
    }
    std::string detail = "processing: " + payment_intent_id.value_or(charge_id.value_or(""));
    co_return verdict::finish(verdict_reason::processing, std::move(detail));
}

net::awaitable<verdict> charge_flow::dead_letter_finish(run& r, std::string reason,
                                                        std::optional<std::string> key) {
    auto added = co_await ledger_.add_dead_letter(r.letter(reason, std::move(key)));
    if (!added) co_return postgres_failed(r, added.err(), "dead letter");
    if (!*added) r.log.info("dead letter already stored for this message", {{"reason", reason}});
    co_return verdict::finish(verdict_reason::dead_lettered, std::move(reason));
}

verdict postgres_failed(const charge_flow_config& cfg, std::int32_t attempts, const logger& log,
                        const error& e, std::string_view step) {
    log.warn("postgres failed; requeueing", {{"step", step}, {"error", e.describe()}});
    return machine::on_postgres_error(cfg.postgres_backoff, attempts, e, step);
}

verdict charge_flow::postgres_failed(run& r, const error& e, std::string_view step) {
    return billing::postgres_failed(cfg_, r.d.attempts, r.log, e, step);
}

}  // namespace cg::billing
