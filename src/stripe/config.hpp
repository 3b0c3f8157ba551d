// How to reach Stripe (or the vault proxy, which speaks the same surface).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "stripe/rate_control.hpp"
#include "stripe/retry.hpp"

namespace cg::stripe {

struct client_config {
    std::string api_base = "https://api.stripe.com";
    std::string api_key;  // sk_… / rk_… (or a vault key); never logged, never argv
    std::string stripe_version = "2024-06-20";
    std::string ca_file;  // PEM bundle; empty: the system store
    std::size_t max_connections = 16;
    // Past this many connections the pool grows only while Stripe keeps its pace (http/pool_growth.hpp):
    // 64 connections at Stripe's typical 300–600 ms carry 100–200 requests/s, above its live-mode limit.
    std::size_t eager_connections = 64;
    // Logical calls (retries included) under way at once; callers past it wait at the client's entry,
    // before their request, coroutines on the strand or a pool slot exist. 0: no bound (callers past
    // max_connections then wait in the pool, each with its whole call built).
    std::size_t max_calls = 0;
    std::chrono::milliseconds connect_timeout{5000};
    std::chrono::milliseconds request_timeout{30000};  // one attempt, including the pool wait
    retry_policy retry;
    // Client-side rate control (stripe/rate_control.hpp); off when max_rps is 0 and adaptive is false.
    rate_config rate{0, false};
};

}  // namespace cg::stripe
