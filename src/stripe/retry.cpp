#include "stripe/retry.hpp"

#include <algorithm>

#include "net/backoff.hpp"

namespace cg::stripe {

std::chrono::milliseconds backoff_delay(const retry_policy& p, unsigned retry, double unit,
                                        std::optional<std::chrono::seconds> retry_after) {
    using ms = std::chrono::milliseconds;
    // At most 2^30 doublings: the shift cannot overflow, and only a cap above initial · 2^30 could tell.
    unsigned doublings = std::min(retry == 0 ? 0u : retry - 1, 30u);
    auto base = net::exponential_delay(p.initial_delay, doublings, p.max_delay);
    ms out =
        std::max(net::apply_jitter(base, net::jitter::half_up, unit), std::min(p.initial_delay, p.max_delay));
    if (retry_after) out = std::max(out, std::min(std::chrono::duration_cast<ms>(*retry_after), p.max_delay));
    return out;
}

}  // namespace cg::stripe
