// The one exponential backoff: every retry delay in the tree — PostgreSQL reconnects
// (pg::pool), NSQ reconnects and handler-failure backoff (nsq/policy), billing's PostgreSQL requeues
// (billing/machine/outcome) and Stripe retries (stripe/retry) — is base · 2^n capped, then optionally
// jittered by one of two conventions. Pure and deterministic: the caller draws `unit` (uniform in [0, 1))
// from its own random source, so tables test it without one. No Asio.
#pragma once

#include <chrono>
#include <cstdint>

namespace cg::net {

// base · 2^doublings, never more than `cap` (the cap wins when base is already above it). Doubling stops at
// the cap, so any number of doublings is safe (no overflow, bounded work). base ≤ 0 gives base capped.
std::chrono::milliseconds exponential_delay(std::chrono::milliseconds base, std::uint64_t doublings,
                                            std::chrono::milliseconds cap) noexcept;

// How a nominal delay d is spread, `unit` in [0, 1) (clamped to [0, 1]); the result is truncated to whole
// milliseconds.
enum class jitter {
    none,       // d
    spread_20,  // d · [0.8, 1.2): reconnects, so a fleet of sidecars does not come back in lockstep
    half_up,    // d · (1 + unit) / 2 ∈ [d/2, d]: Stripe's SDKs ("equal jitter")
};
std::chrono::milliseconds apply_jitter(std::chrono::milliseconds d, jitter j, double unit) noexcept;

// The usual shape: the delay before attempt number `attempt` (1 for the first retry or the first failure;
// 0 counts as 1) is initial · 2^(attempt−1) capped at `max`, then jittered.
struct backoff {
    std::chrono::milliseconds initial{100};
    std::chrono::milliseconds max{5000};
    net::jitter jitter = jitter::none;
};
std::chrono::milliseconds backoff_delay(const backoff& b, std::uint64_t attempt, double unit = 0.0) noexcept;

}  // namespace cg::net
