// The pipeline's per-delivery state and metrics (billing/pipeline.cpp, billing/recovery.cpp).
// Internal to the pipeline.
#pragma once

#include <array>

#include "billing/pipeline.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"

namespace cg::billing {

// One delivery's working state, owned by handle()'s frame.
struct pipeline::run {
    run(delivery del, touch_fn t, const logger& base)
        : d(std::move(del)),
          touch(std::move(t)),
          log(base.with({{"message_id", d.message_id}, {"attempts", d.attempts}})) {}

    delivery d;
    touch_fn touch;
    logger log;
    billing_event ev;
    std::string key;
    lease_token lease{};  // valid once the row is leased to us
    std::int32_t generation = 1;
    std::optional<sys_time> first_attempt;

    dead_letter letter(std::string reason, std::optional<std::string> billing_key) const {
        return {d.topic, d.channel,         d.message_id,          d.attempts,
                d.body,  std::move(reason), std::move(billing_key)};
    }
};

struct pipeline::metrics_set {
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
