// Retry policy for `retry_same_key` answers: bounded, jittered exponential backoff as in Stripe's
// official SDKs (2 retries, 0.5 s initial, 5 s cap). Pure.
#pragma once

#include <chrono>
#include <optional>

namespace cg::stripe {

struct retry_policy {
    unsigned max_retries = 2;  // attempts = 1 + max_retries
    std::chrono::milliseconds initial_delay{500};
    std::chrono::milliseconds max_delay{5000};
    // 429s never executed, and the rate control slows down meanwhile: they may be retried longer, up to this
    // many times (never fewer than max_retries).
    unsigned max_rate_limited_retries = 0;
};

// Delay before retry number `retry` (1 for the first retry). `unit` in [0, 1) draws the jitter:
// d = min(initial · 2^(retry−1), max) · (1 + unit) / 2, never below `initial` (stripe-node's formula).
// A server's Retry-After is honoured when it is longer, up to `max_delay`.
std::chrono::milliseconds backoff_delay(const retry_policy& p, unsigned retry, double unit,
                                        std::optional<std::chrono::seconds> retry_after = std::nullopt);

}  // namespace cg::stripe
