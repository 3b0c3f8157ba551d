#include "net/backoff.hpp"

#include <algorithm>

namespace cg::net {

using std::chrono::milliseconds;

milliseconds exponential_delay(milliseconds base, std::uint64_t doublings, milliseconds cap) noexcept {
    auto d = base.count();
    const auto c = cap.count();
    if (d <= 0) return std::min(base, cap);
    // d < c before each doubling and c fits, so 2·d cannot overflow unless c is within a factor 2 of the
    // largest count: stop there (the cap is reached anyway).
    for (std::uint64_t i = 0; i < doublings && d < c; ++i) d = d > c / 2 ? c : d * 2;
    return milliseconds(std::min(d, c));
}

milliseconds apply_jitter(milliseconds d, jitter j, double unit) noexcept {
    unit = std::clamp(unit, 0.0, 1.0);
    auto x = static_cast<double>(d.count());
    switch (j) {
        case jitter::none:
            return d;
        case jitter::spread_20:
            return milliseconds(static_cast<milliseconds::rep>(x * (0.8 + 0.4 * unit)));
        case jitter::half_up:
            return milliseconds(static_cast<milliseconds::rep>(x * (1.0 + unit) / 2.0));
    }
    return d;
}

milliseconds backoff_delay(const backoff& b, std::uint64_t attempt, double unit) noexcept {
    return apply_jitter(exponential_delay(b.initial, attempt > 0 ? attempt - 1 : 0, b.max), b.jitter, unit);
}

}  // namespace cg::net
