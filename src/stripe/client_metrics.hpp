// Prometheus metrics of one stripe::client (names prefixed chargeguard_stripe_). Several clients may
// share one registry: counters add up, and the connection gauges are kept as the sum of every client's
// last reported figure (each client adds its own change and takes its share back when destroyed).
//
// Threading: prometheus-cpp metrics are thread-safe; every member here is called on the client's
// strand (the offload pool), except the destructor, which runs when no call is in flight.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "http/client.hpp"
#include "metrics/registry.hpp"
#include "stripe/outcome.hpp"

namespace cg::stripe {

// The logical calls the client offers (the find_*_by_billing_key searches count as their list pages).
enum class operation {
    create_charge,
    create_payment_intent,
    retrieve_charge,
    retrieve_payment_intent,
    list_charges,
    list_payment_intents,
    call
};
inline constexpr std::size_t operation_count = 7;
inline constexpr std::size_t outcome_count = 8;  // outcome_class values

std::string_view to_string(operation op) noexcept;

// Why an attempt was retried, as a label value: rate_limited (429), in_use (409), server_error (5xx/424),
// should_retry (Stripe-Should-Retry: true on another status), not_sent (no byte sent), lost (sent, no
// answer).
std::string_view retry_reason(const http::client_result& attempt) noexcept;

class client_metrics {
  public:
    explicit client_metrics(metrics::registry& reg);
    ~client_metrics();
    client_metrics(const client_metrics&) = delete;
    client_metrics& operator=(const client_metrics&) = delete;

    void attempt(operation op);
    void retry(operation op, std::string_view reason);
    void replay(operation op);
    // One logical call ended (after its retries) with `cls`, having taken `took`.
    void finished(operation op, outcome_class cls, std::chrono::steady_clock::duration took);
    // Rate control (stripe/pacer.hpp): one admission and how long it waited; the limit now in force
    // (requests/s, +Inf when nothing limits); one answer that was a 429.
    void paced(std::chrono::steady_clock::duration waited);
    void rate_limit(double rps);
    void throttled();
    // Brings tls_handshakes_total, tls_resumed_total, pool_held_total and the connection gauges up to the
    // client's counters.
    void sync(const http::client_stats& s);

  private:
    metrics::family<metrics::Counter>& retries_;
    std::array<std::array<metrics::Counter*, outcome_count>, operation_count> requests_{};
    std::array<metrics::Histogram*, operation_count> duration_{};
    std::array<metrics::Counter*, operation_count> attempts_{};
    std::array<metrics::Counter*, operation_count> replays_{};
    metrics::Counter* handshakes_ = nullptr;
    metrics::Counter* resumed_ = nullptr;
    metrics::Histogram* pace_wait_ = nullptr;
    metrics::Counter* paced_waits_ = nullptr;
    metrics::Gauge* rate_limit_ = nullptr;
    metrics::Counter* throttled_ = nullptr;
    metrics::Gauge* open_ = nullptr;
    metrics::Gauge* idle_ = nullptr;
    metrics::Counter* held_ = nullptr;
    // What this client has reported so far (the shares it adds to the shared series).
    std::uint64_t handshakes_seen_ = 0, resumed_seen_ = 0, open_seen_ = 0, idle_seen_ = 0, held_seen_ = 0;
};

}  // namespace cg::stripe
