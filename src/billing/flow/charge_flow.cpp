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

machine::flow_config fsm_config(const charge_flow_config& c) {
    machine::flow_config f;
    f.key_namespace = c.key_namespace;
    f.lease = c.lease;
    f.lease_held_delay = c.lease_held_delay;
    f.max_requeue_delay = c.max_requeue_delay;
    f.retry_same_key_delay = c.retry_same_key_delay;
    f.indeterminate_delay = c.indeterminate_delay;
    f.stripe_unavailable_delay = c.stripe_unavailable_delay;
    f.new_key_quiet = c.new_key_quiet;
    f.correction_wait_delay = c.correction_wait_delay;
    f.postgres_backoff = c.postgres_backoff;
    f.same_key_window = c.same_key_window;
    f.search_slack = c.search_slack;
    f.step_pauses = c.test_step_pause.count() > 0;
    return f;
}

charge_flow::charge_flow(charge_flow_config cfg, billing::ledger& ledger, stripe::client& stripe, logger log,
                         metrics::registry* reg)
    : cfg_(std::move(cfg)),
      fsm_cfg_(fsm_config(cfg_)),
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
    r.log.add(run::delivery_log::context::swept, r.key, r.ev);
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    // Named first: g++ 12 destroys a temporary argument of a co_awaited call twice.
    const machine::fsm_input first = machine::in::swept{r.ev, std::move(rec), r.d.attempts, cfg_.now(), unit};
    co_return co_await drive(r, first);
}

net::awaitable<verdict> charge_flow::resume_correction(delivery d, billing_event ev, std::string base) {
    run r(std::move(d), {}, log_);
    r.ev = std::move(ev);
    r.key = base_key(cfg_.key_namespace, r.ev.customer_id, r.ev.billing_period, r.ev.stripe_account);
    if (!r.ev.is_correction() || r.key != base)
        throw std::invalid_argument("resume_correction: revision of " + base + " is not this pipeline's");
    r.log.add(run::delivery_log::context::swept, r.key, r.ev);
    co_return co_await corrections_->handle(r.d, {}, r.ev, r.key, r.log);
}

namespace {

// The level of a delivery's finish line. A decline, a dead letter or a blocked charge is finished but wants a
// person (a retry once the card is fixed, a replay or a dismissal): warn, as a requeue is.
log_level finish_level(const verdict& v, bool past_max_attempts) {
    const bool needs_a_person =
        v.reason == verdict_reason::declined || v.reason == verdict_reason::needs_authentication ||
        v.reason == verdict_reason::dead_lettered || v.reason == verdict_reason::cap_blocked;
    return past_max_attempts && !v.finished() ? log_level::error
           : v.finished() && !needs_a_person  ? log_level::info
                                              : log_level::warn;
}

}  // namespace

net::awaitable<verdict> charge_flow::handle_delivery(delivery d, touch_fn touch, bool past_max_attempts) {
    run r(std::move(d), std::move(touch), log_);
    r.past_max_attempts = past_max_attempts;
    if (past_max_attempts) {
        if (metrics_) metrics_->past_max_attempts->Increment();
        r.log.error(
            "message past max attempts: still processed, never dropped while the ledger can settle it");
    }
    // Debug lines mark each step of a delivery (received, row written, Stripe called, Stripe answered, then
    // the verdict): enough to tell, after a crash, which step a delivery had reached.
    r.log.debug("billing delivery received");
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    const machine::fsm_input first =
        machine::in::delivery{r.d.body, r.d.message_id, r.d.attempts, cfg_.now(), unit};
    auto v = co_await drive(r, first);
    stripe_share_ += ((r.called_stripe ? 1.0 : 0.0) - stripe_share_) / 8.0;
    r.log.log(
        finish_level(v, past_max_attempts),
        v.finished() ? "billing message finished" : "billing message requeued",
        std::array<log_field, 4>{log_field("reason", to_string(v.reason)), log_field("detail", v.detail),
                                 log_field("delay_ms", static_cast<std::int64_t>(v.delay.count())),
                                 log_field("past_max_attempts", past_max_attempts)});
    co_return count(std::move(v));
}

// The loop: the fsm decides, this runs what it decided, until the verdict.
net::awaitable<verdict> charge_flow::drive(run& r, const machine::fsm_input& first) {
    machine::charge_fsm fsm(fsm_cfg_);
    auto cmd = fsm.resume(first);
    // A delivery's log context reads the event and key where the fsm keeps them (no copy of them per
    // delivery); they go with this frame, so the context is rendered before that if a line still follows.
    const bool borrowed = !r.log.has_event() && fsm.event_known();
    if (borrowed) r.log.add(run::delivery_log::context::event, fsm.key(), fsm.event());
    for (;;) {
        if (!cmd.note.empty()) {
            if (cmd.alert)
                r.log.error(cmd.note, {{"alert", true}});
            else if (cmd.warn)
                r.log.warn(cmd.note);
            else
                r.log.info(cmd.note);
        }
        if (cmd.what == machine::op::done) break;
        auto next = co_await execute(r, fsm, cmd);
        cmd = fsm.resume(next);
    }
    if (cmd.journal)
        journal_.note({fsm.key(), fsm.generation(), fsm.first_lease(), fsm.held_lease(), cmd.journal->status,
                       cmd.journal->charge_id, cmd.journal->payment_intent_id, cmd.journal->message,
                       std::chrono::steady_clock::now()});
    // handle_delivery()'s finish line is the one line written after this.
    if (borrowed) r.log.forget(r.log.enabled(finish_level(cmd.result, r.past_max_attempts)));
    co_return std::move(cmd.result);
}

net::awaitable<void> charge_flow::test_pause() {
    if (cfg_.test_step_pause.count() <= 0) co_return;
    auto ms = std::uniform_int_distribution<std::int64_t>(0, cfg_.test_step_pause.count())(rng_);
    net::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
    co_await t.async_wait();
}

// The group-commit wait follows Stripe's pace: 1 % of the average call time, capped (charge_flow_config).
void charge_flow::note_stripe_time(std::chrono::steady_clock::duration took) {
    double us = std::chrono::duration<double, std::micro>(took).count();
    stripe_time_avg_us_ += (us - stripe_time_avg_us_) / 16.0;
    auto cap = static_cast<double>(cfg_.group_commit_linger_max.count());
    ledger_.set_linger(
        std::chrono::microseconds(static_cast<std::int64_t>(std::min(cap, stripe_time_avg_us_ / 100.0))));
}

verdict postgres_failed(const charge_flow_config& cfg, std::int32_t attempts, const logger& log,
                        const error& e, std::string_view step) {
    log.warn("postgres failed; requeueing", {{"step", step}, {"error", e.describe()}});
    return machine::on_postgres_error(cfg.postgres_backoff, attempts, e, step);
}

}  // namespace cg::billing
