// The flow's per-delivery state and metrics (billing/flow/charge_flow.cpp, charge_flow_steps.cpp).
// Internal to the pipeline.
#pragma once

#include <array>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>

#include "billing/flow/charge_flow.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"

namespace cg::billing {

// One delivery's working state, owned by the frame of handle_delivery() (resume(), resume_correction()).
struct charge_flow::run {
    // The delivery's logger: the pipeline's, with the delivery's context (message id and attempts, then once
    // the event is known its billing key, customer and period, or for a swept row the key and "swept"). The
    // context is rendered on the first line actually written: at warn a delivery that ends well (a charge, a
    // duplicate) writes none and renders none; at info its finish line renders it once. Used like a logger;
    // converts to one where a logger is passed on (which renders the context).
    class delivery_log {
      public:
        enum class context { delivery, event, swept };

        delivery_log(const logger& base, const run& r) : base_(&base), r_(&r) {}
        delivery_log(const delivery_log&) = delete;
        delivery_log& operator=(const delivery_log&) = delete;

        // The event's fields (`event`: billing key, customer, period and a connected account; `swept`: the
        // key and swept=true) join the context from now on. `key` and `ev` are read when the context is
        // rendered: they must live until then, or until forget().
        void add(context c, const std::string& key, const billing_event& ev) {
            ctx_ = c;
            key_ = &key;
            ev_ = &ev;
            if (built_) append(*built_, c);
        }
        bool has_event() const noexcept { return ctx_ != context::delivery; }
        // The key and event given to add() are about to go: the context is rendered now if `render` (a line
        // will still be written), else the event's fields leave it (no line is expected any more; one written
        // anyway carries the delivery's fields only).
        void forget(bool render) {
            if (render) get();
            if (!built_) ctx_ = context::delivery;
            key_ = nullptr;
            ev_ = nullptr;
        }

        const logger& get() const {
            if (!built_) {
                built_ = base_->with({{"message_id", r_->d.message_id}, {"attempts", r_->d.attempts}});
                if (ctx_ != context::delivery) append(*built_, ctx_);
            }
            return *built_;
        }
        operator const logger&() const { return get(); }

        bool enabled(log_level l) const noexcept { return base_->enabled(l); }
        void log(log_level l, std::string_view m, std::span<const log_field> f = {}) const {
            if (enabled(l)) get().log(l, m, f);
        }
        void debug(std::string_view m, std::initializer_list<log_field> f = {}) const {
            log(log_level::debug, m, std::span(f.begin(), f.size()));
        }
        void info(std::string_view m, std::initializer_list<log_field> f = {}) const {
            log(log_level::info, m, std::span(f.begin(), f.size()));
        }
        void warn(std::string_view m, std::initializer_list<log_field> f = {}) const {
            log(log_level::warn, m, std::span(f.begin(), f.size()));
        }
        void error(std::string_view m, std::initializer_list<log_field> f = {}) const {
            log(log_level::error, m, std::span(f.begin(), f.size()));
        }

      private:
        void append(logger& l, context c) const {
            if (c == context::swept) {
                l = l.with({{"billing_key", *key_}, {"swept", true}});
                return;
            }
            l = l.with(
                {{"billing_key", *key_}, {"customer_id", ev_->customer_id}, {"period", ev_->billing_period}});
            if (ev_->connected()) l = l.with({{"stripe_account", ev_->stripe_account}});
        }

        const logger* base_;
        const run* r_;
        context ctx_ = context::delivery;
        const std::string* key_ = nullptr;
        const billing_event* ev_ = nullptr;
        mutable std::optional<logger> built_;
    };

    run(delivery del, touch_fn t, const logger& base)
        : d(std::move(del)), touch(std::move(t)), log(base, *this) {}
    // `log` refers to this run.
    run(const run&) = delete;
    run& operator=(const run&) = delete;

    delivery d;
    touch_fn touch;
    delivery_log log;
    billing_event ev;  // a swept row's event and key (resume()); a delivery's are the fsm's
    std::string key;
    bool called_stripe = false;      // a create was started (charge_flow::deliveries_call_stripe)
    bool past_max_attempts = false;  // give_up(): the finish line's level (finish_level)

    dead_letter letter(std::string reason, std::optional<std::string> billing_key) const {
        return {d.topic, d.channel,         d.message_id,          d.attempts,
                d.body,  std::move(reason), std::move(billing_key)};
    }
};

struct charge_flow::metrics_set {
    std::array<metrics::Counter*, verdict_reason_count> outcomes{};
    metrics::Histogram* stripe_duration = nullptr;
    metrics::Counter* past_max_attempts = nullptr;
    metrics::Counter* lease_lost = nullptr;
    metrics::Counter* requires_capture = nullptr;
    metrics::Counter* failed_after_processing = nullptr;

    explicit metrics_set(metrics::registry& reg) {
        auto& fam = reg.counter("chargeguard_billing_messages_total", "Billing deliveries by verdict reason");
        // Every series exists from the start so alerts on rates see zeros instead of gaps.
        for (std::size_t i = 0; i < verdict_reason_count; ++i)
            outcomes[i] = &fam.Add({{"outcome", std::string(to_string(static_cast<verdict_reason>(i)))}});
        stripe_duration =
            &reg.histogram("chargeguard_billing_stripe_call_duration_seconds",
                           "Create-charge calls as the pipeline awaited them (client retries included)")
                 .Add({}, metrics::latency_buckets());
        past_max_attempts = &reg.counter("chargeguard_billing_past_max_attempts_total",
                                         "Deliveries past --max-attempts, kept going through the machine "
                                         "instead of being dropped (a message that keeps coming back)")
                                 .Add({});
        lease_lost = &reg.counter("chargeguard_billing_lease_lost_total",
                                  "Leases (of a charge or a correction) found taken over by another worker "
                                  "while Stripe was being called")
                          .Add({});
        requires_capture =
            &reg.counter("chargeguard_billing_requires_capture_total",
                         "PaymentIntents Stripe left requires_capture: an authorisation "
                         "chargeguard never asks for (an anomaly; the row waits as processing)")
                 .Add({});
        failed_after_processing =
            &reg.counter("chargeguard_billing_failed_after_processing_total",
                         "Payments that failed after processing (dead-lettered; a replay charges again)")
                 .Add({});
    }
};

}  // namespace cg::billing
