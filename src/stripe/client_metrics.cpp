#include "stripe/client_metrics.hpp"

#include <limits>

namespace cg::stripe {
namespace {

constexpr std::array<operation, operation_count> all_operations{operation::create_charge,
                                                                operation::create_payment_intent,
                                                                operation::retrieve_charge,
                                                                operation::retrieve_payment_intent,
                                                                operation::list_charges,
                                                                operation::list_payment_intents,
                                                                operation::call};

constexpr std::array<outcome_class, outcome_count> all_outcomes{
    outcome_class::succeeded,      outcome_class::declined,
    outcome_class::cap_exceeded,   outcome_class::idempotency_conflict,
    outcome_class::retry_same_key, outcome_class::indeterminate,
    outcome_class::rejected,       outcome_class::setup_error};

std::string label(operation op) {
    return std::string(to_string(op));
}

// A counter catches up with the client's figure (which only grows).
void advance_counter(metrics::Counter& c, std::uint64_t& seen, std::uint64_t now) {
    if (now <= seen) return;
    c.Increment(static_cast<double>(now - seen));
    seen = now;
}

// Moves a shared gauge by this client's change since it last reported.
void move_gauge(metrics::Gauge& g, std::uint64_t& seen, std::uint64_t now) {
    if (now >= seen)
        g.Increment(static_cast<double>(now - seen));
    else
        g.Decrement(static_cast<double>(seen - now));
    seen = now;
}

}  // namespace

std::string_view to_string(operation op) noexcept {
    switch (op) {
        case operation::create_charge:
            return "create_charge";
        case operation::create_payment_intent:
            return "create_payment_intent";
        case operation::retrieve_charge:
            return "retrieve_charge";
        case operation::retrieve_payment_intent:
            return "retrieve_payment_intent";
        case operation::list_charges:
            return "list_charges";
        case operation::list_payment_intents:
            return "list_payment_intents";
        case operation::call:
            return "call";
    }
    return "unknown";
}

std::string_view retry_reason(const http::client_result& a) noexcept {
    if (!a.ok()) return a.request_sent ? "lost" : "not_sent";
    const int s = a.resp.status;
    if (s == 429) return "rate_limited";
    if (s == 409) return "in_use";
    if (s >= 500 || s == 424) return "server_error";
    return "should_retry";
}

client_metrics::client_metrics(metrics::registry& reg)
    : retries_(reg.counter(
          "chargeguard_stripe_retries_total",
          "Stripe attempts retried with the same idempotency key, by the reason of the retried answer")) {
    auto& requests = reg.counter("chargeguard_stripe_requests_total",
                                 "Logical Stripe calls (retries included) by final outcome class");
    auto& duration = reg.histogram("chargeguard_stripe_request_duration_seconds",
                                   "Whole logical Stripe call including retries and backoff");
    auto& attempts = reg.counter("chargeguard_stripe_attempts_total",
                                 "HTTP attempts sent to Stripe (first tries and retries)");
    auto& replays = reg.counter("chargeguard_stripe_idempotent_replays_total",
                                "Stripe answers carrying Idempotent-Replayed: true");
    // Every series exists from the start, so rates and alerts see zeros instead of gaps.
    for (auto op : all_operations) {
        auto i = static_cast<std::size_t>(op);
        for (auto c : all_outcomes)
            requests_[i][static_cast<std::size_t>(c)] =
                &requests.Add({{"operation", label(op)}, {"outcome", std::string(to_string(c))}});
        duration_[i] = &duration.Add({{"operation", label(op)}}, metrics::latency_buckets());
        attempts_[i] = &attempts.Add({{"operation", label(op)}});
        replays_[i] = &replays.Add({{"operation", label(op)}});
    }
    handshakes_ =
        &reg.counter("chargeguard_stripe_tls_handshakes_total", "TLS handshakes completed with Stripe")
             .Add({});
    resumed_ =
        &reg.counter("chargeguard_stripe_tls_resumed_total",
                     "TLS handshakes with Stripe that resumed a cached session (no certificate exchanged)")
             .Add({});
    open_ = &reg.gauge("chargeguard_stripe_connections_open",
                       "Connections to Stripe open (idle, busy or connecting)")
                 .Add({});
    idle_ = &reg.gauge("chargeguard_stripe_connections_idle", "Idle pooled connections to Stripe").Add({});
    held_ =
        &reg.counter("chargeguard_stripe_pool_held_total",
                     "Requests that waited for a pooled connection to come back because the pool, past "
                     "--stripe-eager-connections, held its size: Stripe's answer rate or pace did not call "
                     "for another connection")
             .Add({});
    pace_wait_ = &reg.histogram("chargeguard_stripe_rate_limit_wait_seconds",
                                "Time an attempt waited for the client's rate limit before it was sent")
                      .Add({}, metrics::latency_buckets());
    paced_waits_ = &reg.counter("chargeguard_stripe_rate_limit_waits_total",
                                "Attempts that had to wait for the client's rate limit")
                        .Add({});
    rate_limit_ = &reg.gauge("chargeguard_stripe_rate_limit_rps",
                             "Requests/s the client allows itself now (--stripe-max-rps and the adaptive "
                             "limit; +Inf when nothing limits)")
                       .Add({});
    rate_limit_->Set(std::numeric_limits<double>::infinity());
    throttled_ = &reg.counter("chargeguard_stripe_throttled_total", "Stripe answers with HTTP 429").Add({});
}

void client_metrics::paced(std::chrono::steady_clock::duration waited) {
    pace_wait_->Observe(std::chrono::duration<double>(waited).count());
    if (waited > std::chrono::steady_clock::duration::zero()) paced_waits_->Increment();
}

void client_metrics::rate_limit(double rps) {
    rate_limit_->Set(rps);
}

void client_metrics::throttled() {
    throttled_->Increment();
}

client_metrics::~client_metrics() {
    // The client's connections go with it: take its share out of the shared gauges.
    move_gauge(*open_, open_seen_, 0);
    move_gauge(*idle_, idle_seen_, 0);
}

void client_metrics::attempt(operation op) {
    attempts_[static_cast<std::size_t>(op)]->Increment();
}

void client_metrics::retry(operation op, std::string_view reason) {
    // Rare: the family lookup (a mutex and a hash) is cheap enough here.
    retries_.Add({{"operation", label(op)}, {"reason", std::string(reason)}}).Increment();
}

void client_metrics::replay(operation op) {
    replays_[static_cast<std::size_t>(op)]->Increment();
}

void client_metrics::finished(operation op, outcome_class cls, std::chrono::steady_clock::duration took) {
    auto i = static_cast<std::size_t>(op);
    requests_[i][static_cast<std::size_t>(cls)]->Increment();
    duration_[i]->Observe(std::chrono::duration<double>(took).count());
}

void client_metrics::sync(const http::client_stats& s) {
    advance_counter(*resumed_, resumed_seen_, s.resumed);
    advance_counter(*handshakes_, handshakes_seen_, s.handshakes);
    advance_counter(*held_, held_seen_, s.held);
    move_gauge(*open_, open_seen_, s.open);
    move_gauge(*idle_, idle_seen_, s.idle);
}

}  // namespace cg::stripe
