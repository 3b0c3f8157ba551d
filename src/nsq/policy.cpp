#include "nsq/policy.hpp"

#include <algorithm>
#include <cstdint>

#include "net/backoff.hpp"

namespace cg::nsq {

std::vector<unsigned> plan_rdy(std::span<const rdy_conn> conns, unsigned max_in_flight,
                               clock::duration idle_timeout, std::size_t& cursor) {
    const std::size_t n = conns.size();
    std::vector<unsigned> out(n, 0);
    if (n == 0 || max_in_flight == 0) return out;
    if (n <= max_in_flight) {
        unsigned share = max_in_flight / static_cast<unsigned>(n);
        unsigned extra = max_in_flight % static_cast<unsigned>(n);
        for (std::size_t i = 0; i < n; ++i) {
            unsigned want = share + (i < extra ? 1 : 0);
            out[i] = std::max(1u, std::min(want, conns[i].max_rdy));
        }
        return out;
    }
    // More connections than max_in_flight: RDY 1 rotates. Busy holders keep theirs.
    unsigned kept = 0;
    std::vector<bool> released(n, false);
    for (std::size_t i = 0; i < n; ++i) {
        if (conns[i].current == 0) continue;
        if (conns[i].idle < idle_timeout && kept < max_in_flight) {
            out[i] = 1;
            ++kept;
        } else {
            released[i] = true;
        }
    }
    const std::size_t start = cursor;
    for (std::size_t step = 0; step < n && kept < max_in_flight; ++step) {
        std::size_t i = (start + step) % n;
        if (out[i] == 0 && !released[i]) {
            out[i] = 1;
            ++kept;
            cursor = (i + 1) % n;
        }
    }
    // Everyone else was released this round: let released ones take the remaining budget.
    for (std::size_t i = 0; i < n && kept < max_in_flight; ++i) {
        if (out[i] == 0) {
            out[i] = 1;
            ++kept;
        }
    }
    return out;
}

milliseconds backoff_policy::duration_for(int level) const {
    if (level <= 0) return milliseconds(0);
    // multiplier · 2^level, capped.
    return net::exponential_delay(mult_, static_cast<std::uint64_t>(level), max_);
}

backoff_policy::decision backoff_policy::signal(int up, int down) {
    // Signals during a backoff timeout are ignored so a burst of failures (or successes) from messages
    // already in flight does not jump straight to the maximum (or back to full speed).
    if (in_timeout_) return {};
    bool updated = false;
    if (down < 0 && level_ > 0) {
        --level_;
        updated = true;
    } else if (up > 0) {
        // Up one level only while multiplier · 2^(level+1) is still within max: capped one past max, so
        // "beyond" stays visible.
        auto next =
            net::exponential_delay(mult_, static_cast<std::uint64_t>(level_ + 1), max_ + milliseconds(1));
        if (next <= max_) {
            ++level_;
            updated = true;
        }
    }
    if (level_ == 0 && updated) return {action::resume_all, milliseconds(0)};
    if (level_ > 0) {
        in_timeout_ = true;
        return {action::backoff, duration_for(level_)};
    }
    return {};
}

bool backoff_needs_rearm(const backoff_progress& p) noexcept {
    return p.backing_off && !p.in_timeout && !p.trial_out && !p.handlers_pending;
}

std::optional<clock::time_point> next_touch(clock::time_point now, clock::time_point delivered,
                                            milliseconds msg_timeout, milliseconds max_msg_timeout) {
    auto next = now + msg_timeout / 2;
    if (next > delivered + max_msg_timeout - msg_timeout) return std::nullopt;
    return next;
}

milliseconds reconnect_delay(unsigned attempt, milliseconds min, milliseconds max, double unit) {
    return net::backoff_delay({min, max, net::jitter::spread_20}, attempt, unit);
}

milliseconds default_requeue_delay(unsigned attempts, milliseconds dflt, milliseconds max) {
    auto d = dflt * std::max(1u, attempts);
    return std::min(d, max);
}

}  // namespace cg::nsq
