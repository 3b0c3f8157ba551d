// fake-stripe's rate limiter, shaped like Stripe's (specs/stripe.md "Rate limits"): a token bucket for the
// whole account, one per endpoint (method + path with object ids folded), and a concurrency limit. Pure: the
// time and the number of requests in flight are passed in. A refused request costs no token. The limits may
// change while running (POST /_admin/limits), the buckets keeping what they hold. Stripe's bucket depth and
// refill cannot be seen from outside, so both are chosen here: `burst_s` deep, refilled continuously or in
// whole tokens every `refill_s` (rate × refill_s of them at each tick, the fractions carried).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace cg::fake {

struct limits {
    double global_rps = 0;    // the account's requests/s (Stripe: 100 live, 25 test); 0: off
    double endpoint_rps = 0;  // per endpoint (Stripe's default: 25); 0: off
    double burst_s = 1;       // bucket depth in seconds of its rate (at least one token)
    int max_concurrent = 0;   // requests in flight at once; 0: off
    double refill_s = 0;      // 0: refilled continuously; else whole tokens every this many seconds
};

class limiter {
  public:
    using clock = std::chrono::steady_clock;
    enum class verdict { ok, rate_limited, too_concurrent };

    // "POST /v1/charges", "GET /v1/charges/:id", …
    static std::string endpoint_of(std::string_view method, std::string_view path);

    // Sets the limits; may be called while running (Stripe lowers limits under load): see limiter.cpp.
    void set(const limits& l, clock::time_point now);
    const limits& get() const noexcept { return limits_; }
    // One request arriving while `in_flight` others are being served.
    verdict admit(std::string_view endpoint, clock::time_point now, int in_flight);

    std::uint64_t rate_limited() const noexcept { return rate_limited_; }
    std::uint64_t too_concurrent() const noexcept { return too_concurrent_; }
    std::uint64_t changes() const noexcept { return changes_; }

  private:
    struct bucket {
        double tokens = 0;
        clock::time_point at{};
        bool ready(double rate, double depth, double step_s, clock::time_point now);
    };
    limits limits_;
    bucket global_;
    std::map<std::string, bucket, std::less<>> endpoints_;
    std::uint64_t rate_limited_ = 0, too_concurrent_ = 0, changes_ = 0;
};

}  // namespace cg::fake
