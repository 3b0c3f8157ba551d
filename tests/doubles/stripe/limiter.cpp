#include "tests/doubles/stripe/limiter.hpp"

#include <algorithm>
#include <cmath>

namespace cg::fake {

std::string limiter::endpoint_of(std::string_view method, std::string_view path) {
    // /v1/charges/ch_123 → /v1/charges/:id; /v1/charges/search stays (Stripe limits search on its own).
    std::string out(method);
    out += ' ';
    std::size_t seg = 0, i = 0;
    while (i < path.size()) {
        std::size_t next = path.find('/', i + 1);
        std::string_view part =
            path.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i);
        out += (seg >= 2 && part.size() > 1 && part != "/search") ? std::string_view("/:id") : part;
        ++seg;
        if (next == std::string_view::npos) break;
        i = next;
    }
    return out;
}

bool limiter::bucket::ready(double rate, double depth, double step_s, clock::time_point now) {
    double cap = std::max(1.0, rate * depth);
    if (at == clock::time_point{}) tokens = cap;
    if (now > at) {
        if (step_s > 0) {
            // Whole tokens at fixed ticks of the clock: tick k has granted floor(k × rate × step) in all,
            // so the long-run rate is exact and no token comes between two ticks.
            auto step = std::max<std::int64_t>(1, std::llround(step_s * 1e9));
            auto granted = [&](clock::time_point t) {
                auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
                return std::floor(static_cast<double>(ns / step) * rate * step_s + 1e-9);
            };
            tokens = std::min(cap, tokens + (granted(now) - granted(at)));
        } else {
            tokens = std::min(cap, tokens + std::chrono::duration<double>(now - at).count() * rate);
        }
    }
    at = std::max(at, now);
    return tokens >= 1;
}

void limiter::set(const limits& l, clock::time_point now) {
    // A change while running keeps what each bucket holds (refilled at the old rate up to now, then capped
    // at the new depth): lowering the limit grants no fresh burst, raising it none either. Buckets never
    // used start full at the new rate.
    auto carry = [&](bucket& b, double old_rate, double new_rate) {
        if (b.at == clock::time_point{}) return;
        if (old_rate > 0) (void)b.ready(old_rate, limits_.burst_s, limits_.refill_s, now);
        if (new_rate <= 0 || old_rate <= 0) {
            b = {};
            return;
        }
        b.tokens = std::min(b.tokens, std::max(1.0, new_rate * l.burst_s));
    };
    carry(global_, limits_.global_rps, l.global_rps);
    for (auto& [name, b] : endpoints_) carry(b, limits_.endpoint_rps, l.endpoint_rps);
    limits_ = l;
    ++changes_;
}

limiter::verdict limiter::admit(std::string_view endpoint, clock::time_point now, int in_flight) {
    if (limits_.max_concurrent > 0 && in_flight >= limits_.max_concurrent) {
        ++too_concurrent_;
        return verdict::too_concurrent;
    }
    bucket* ep = nullptr;
    if (limits_.endpoint_rps > 0) {
        auto it = endpoints_.find(endpoint);
        if (it == endpoints_.end()) it = endpoints_.emplace(std::string(endpoint), bucket{}).first;
        ep = &it->second;
    }
    bool ok = (limits_.global_rps <= 0 ||
               global_.ready(limits_.global_rps, limits_.burst_s, limits_.refill_s, now)) &&
              (!ep || ep->ready(limits_.endpoint_rps, limits_.burst_s, limits_.refill_s, now));
    if (!ok) {
        ++rate_limited_;
        return verdict::rate_limited;
    }
    if (limits_.global_rps > 0) global_.tokens -= 1;
    if (ep) ep->tokens -= 1;
    return verdict::ok;
}

}  // namespace cg::fake
