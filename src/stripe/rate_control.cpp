#include "stripe/rate_control.hpp"

#include <algorithm>
#include <cmath>

namespace cg::stripe {
namespace {

double seconds(rate_control::clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

}  // namespace

rate_control::rate_control(rate_config cfg, time_point now)
    : cfg_(cfg), refilled_(now), last_increase_(now), sent_{now}, accepted_{now} {
    cfg_.min_rps = std::max(cfg_.min_rps, 0.001);
    cfg_.decrease_factor = std::clamp(cfg_.decrease_factor, 0.01, 0.99);
    cfg_.burst_s = std::max(cfg_.burst_s, 0.0);
    if (cfg_.adaptive && cfg_.initial_rps > 0) {
        adaptive_ = std::max(cfg_.initial_rps, cfg_.min_rps);
        if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
        slow_start_ = true;
    }
    refill(now);
}

double rate_control::limit() const noexcept {
    double ceiling = cfg_.max_rps > 0 ? cfg_.max_rps : unlimited;
    return cfg_.adaptive ? std::min(ceiling, adaptive_) : ceiling;
}

void rate_control::refill(time_point now) {
    double l = limit();
    double cap = std::isinf(l) ? 1 : std::max(1.0, l * cfg_.burst_s);
    if (now > refilled_) {
        tokens_ = std::isinf(l) ? cap : std::min(cap, tokens_ + seconds(now - refilled_) * l);
        refilled_ = now;
    }
    tokens_ = std::min(tokens_, cap);  // a lowered limit shrinks the bucket at once
}

bool rate_control::try_take(time_point now) {
    refill(now);
    if (!std::isinf(limit()) && tokens_ < 1) {
        pressed_ = true;
        return false;
    }
    if (!std::isinf(limit())) tokens_ -= 1;
    sent_.add(now);
    return true;
}

rate_control::clock::duration rate_control::until_next(time_point now) {
    refill(now);
    double l = limit();
    if (std::isinf(l) || tokens_ >= 1) return clock::duration::zero();
    auto wait = std::chrono::duration<double>((1 - tokens_) / l);
    return std::max(std::chrono::duration_cast<clock::duration>(wait), clock::duration(1));
}

void rate_control::rate_window::add(time_point now) {
    if (now - start >= std::chrono::seconds(1)) {
        last = static_cast<double>(count) / seconds(now - start);
        start = now;
        count = 0;
    }
    ++count;
}

double rate_control::rate_window::rate(time_point now) const noexcept {
    if (last >= 0 && now - start < std::chrono::seconds(2)) return last;
    if (now - start >= std::chrono::seconds(1)) return static_cast<double>(count) / seconds(now - start);
    return static_cast<double>(count) / std::max(seconds(now - start), 0.1);
}

void rate_control::on_response(time_point now, bool throttled) {
    if (!cfg_.adaptive) return;
    if (!throttled) accepted_.add(now);
    if (throttled) {
        if (decreased_once_ && now - last_decrease_ < cfg_.decrease_hold) return;
        refill(now);  // tokens earned at the old limit count at the old limit
        double base = std::min({adaptive_, sent_rate(now), accepted_rate(now)});
        adaptive_ = std::max(cfg_.min_rps, base * cfg_.decrease_factor);
        if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
        last_decrease_ = now;
        decreased_once_ = true;
        last_increase_ = now;
        slow_start_ = false;
        pressed_ = false;
        ++decreases_;
        return;
    }
    if (std::isinf(adaptive_) || now <= last_increase_) return;
    if (!pressed_) {  // demand did not reach the limit: nothing learned, nothing to grow
        last_increase_ = now;
        return;
    }
    if (slow_start_) {
        if (now - last_increase_ < cfg_.slow_start_step) return;
        refill(now);
        adaptive_ *= 2;
    } else {
        refill(now);
        adaptive_ += cfg_.increase_rps_per_s * seconds(now - last_increase_);
    }
    if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
    last_increase_ = now;
    pressed_ = false;
}

}  // namespace cg::stripe
