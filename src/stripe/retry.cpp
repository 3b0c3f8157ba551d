#include "stripe/retry.hpp"

#include <algorithm>

namespace cg::stripe {

std::chrono::milliseconds backoff_delay(const retry_policy& p, unsigned retry, double unit,
                                        std::optional<std::chrono::seconds> retry_after) {
    using ms = std::chrono::milliseconds;
    unit = std::clamp(unit, 0.0, 1.0);
    unsigned shift = std::min(retry == 0 ? 0u : retry - 1, 30u);
    double base = std::min(static_cast<double>(p.initial_delay.count()) * static_cast<double>(1ull << shift),
                           static_cast<double>(p.max_delay.count()));
    double d = std::max(base * (1.0 + unit) / 2.0,
                        static_cast<double>(std::min(p.initial_delay, p.max_delay).count()));
    ms out(static_cast<ms::rep>(d));
    if (retry_after) out = std::max(out, std::min(std::chrono::duration_cast<ms>(*retry_after), p.max_delay));
    return out;
}

}  // namespace cg::stripe
