#include "stripe/rate_control.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cg::stripe {
namespace {

double seconds(rate_control::clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

}  // namespace

double peer_share(const peer_load* peers, std::size_t n, std::size_t self, double account_limit,
                  double idle_weight) {
    if (n <= 1 || self >= n) return 1;
    bool even = !(account_limit > 0) || std::isinf(account_limit);
    double fair = account_limit / static_cast<double>(n);
    auto weight = [&](const peer_load& p) {
        if (even || p.pressed) return 1.0;
        return std::clamp(p.sent_rps / fair, idle_weight, 1.0);
    };
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += weight(peers[i]);
    return weight(peers[self]) / total;
}

void apply_peers(rate_control& rc, const peer_view* peers, std::size_t n, std::size_t self,
                 rate_control::time_point now) {
    if (n == 0 || self >= n) {
        rc.set_share(1, now);
        rc.set_peers(1);
        rc.lead(now);
        return;
    }
    std::vector<peer_load> loads;
    loads.reserve(n);
    std::size_t leader = n;
    for (std::size_t i = 0; i < n; ++i) {
        loads.push_back(peers[i].load);
        if (leader == n && peers[i].load.pressed) leader = i;
    }
    if (leader == n) leader = 0;
    if (leader == self) rc.lead(now);
    for (std::size_t i = 0; i < n; ++i) {
        if (i == self) continue;
        if (leader == self && peers[i].load.pressed) rc.note_peer_pressed(now);
        if (peers[i].throttled_since) rc.on_peer_throttled(now);
    }
    if (leader != self) rc.follow(peers[leader].account_limit, now);
    rc.set_share(peer_share(loads.data(), n, self, rc.account_limit()), now);
    rc.set_peers(n);
}

rate_control::rate_control(rate_config cfg, time_point now)
    : cfg_(cfg), refilled_(now), last_increase_(now), sent_{now}, accepted_{now}, own_sent_{now} {
    cfg_.min_rps = std::max(cfg_.min_rps, 0.001);
    cfg_.decrease_factor = std::clamp(cfg_.decrease_factor, 0.01, 0.99);
    cfg_.burst_s = std::max(cfg_.burst_s, 0.0);
    if (cfg_.adaptive && cfg_.initial_rps > 0) {
        adaptive_ = std::max(cfg_.initial_rps, cfg_.min_rps);
        if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
        slow_start_ = true;
    }
    floor_ = cfg_.min_rps;
    refill(now);
}

void rate_control::set_peers(std::size_t n) noexcept {
    floor_ = cfg_.min_rps * static_cast<double>(std::max<std::size_t>(n, 1));
    if (cfg_.adaptive && !std::isinf(adaptive_)) adaptive_ = std::max(adaptive_, floor_);
}

double rate_control::limit() const noexcept {
    double ceiling = cfg_.max_rps > 0 ? cfg_.max_rps : unlimited;
    return cfg_.adaptive ? std::min(ceiling, adaptive_ * share_) : ceiling;
}

void rate_control::set_share(double share, time_point now) {
    refill(now);  // tokens earned at the old share count at the old share
    share_ = std::clamp(share, 0.01, 1.0);
    refill(now);
}

void rate_control::on_peer_throttled(time_point now) {
    if (!cfg_.adaptive) return;
    if (following_) {  // the leader decreases for the account; the slow start is over for everyone
        slow_start_ = false;
        return;
    }
    if (decreased_once_ && now - last_decrease_ < cfg_.decrease_hold) return;
    decrease(now);
}

void rate_control::follow(double account_limit, time_point now) {
    if (!cfg_.adaptive || !(account_limit > 0)) return;
    following_ = true;
    // Within decrease_hold of its own decrease the leader may not have heard of it yet: its figure counts
    // only if it is lower (a decrease of its own, deeper than this one).
    if (decreased_once_ && now - last_decrease_ < cfg_.decrease_hold) {
        if (account_limit < adaptive_) {
            refill(now);
            adaptive_ = std::max(floor_, account_limit);
        }
        return;
    }
    refill(now);
    adaptive_ = std::max(floor_, account_limit);
    if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
    last_increase_ = now;
}

void rate_control::lead(time_point now) {
    if (!following_) return;
    following_ = false;
    if (std::isinf(adaptive_)) return;
    // The account still in its slow start (no 429 episode heard of yet): keep doubling from the followed
    // limit. Otherwise continue from it as from an estimate just reached: the probe past it, slow at first.
    last_increase_ = now;
    if (slow_start_) return;
    estimate_ = adaptive_;
    dip_from_ = adaptive_;
    calibrating_ = false;
    rebound_ = false;
    reclaiming_ = false;
    curve_s_ = seconds(cfg_.recover);
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
        pressed_since_ = true;
        pressed_at_ = now;
        pressed_seen_ = true;
        return false;
    }
    if (!std::isinf(limit())) tokens_ -= 1;
    sent_.add(now, 1 / share_);
    own_sent_.add(now, 1);
    recent_sent_.add(now, 1 / share_);
    return true;
}

rate_control::clock::duration rate_control::until_next(time_point now) {
    refill(now);
    double l = limit();
    if (std::isinf(l) || tokens_ >= 1) return clock::duration::zero();
    auto wait = std::chrono::duration<double>((1 - tokens_) / l);
    return std::max(std::chrono::duration_cast<clock::duration>(wait), clock::duration(1));
}

void rate_control::rate_window::add(time_point now, double weight) {
    if (now - start >= std::chrono::seconds(1)) {
        // A window that lasted seconds was mostly idle (a process that waited for its first request): it
        // says nothing of the rate now, which the new window measures from its start.
        last = now - start < std::chrono::seconds(2) ? count / seconds(now - start) : -1;
        start = now;
        count = 0;
    }
    count += weight;
}

double rate_control::rate_window::rate(time_point now) const noexcept {
    if (last >= 0 && now - start < std::chrono::seconds(2)) return last;
    if (now - start >= std::chrono::seconds(1)) return count / seconds(now - start);
    return count / std::max(seconds(now - start), 0.1);
}

void rate_control::recent::add(time_point now, double weight) {
    auto bin = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() / 100;
    if (first_bin < 0) first_bin = bin;
    int i = static_cast<int>(bin % bins);
    if (bin_of_[i] != bin) {
        bin_of_[i] = bin;
        count_[i] = 0;
    }
    count_[i] += weight;
}

double rate_control::recent::rate(time_point now) const noexcept {
    if (first_bin < 0) return 0;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    auto bin = ms / 100;
    double n = 0;
    for (int i = 0; i < bins; ++i)
        if (bin_of_[i] > bin - bins && bin_of_[i] <= bin) n += count_[i];
    // The current bin is as long as it has lasted; a process younger than a second is measured over its age.
    auto full = std::min<std::int64_t>(bins - 1, bin - first_bin);
    double span = 0.1 * static_cast<double>(full) + 0.001 * static_cast<double>(ms % 100 + 1);
    return n / std::max(span, 0.1);
}

void rate_control::decrease(time_point now) {
    refill(now);  // tokens earned at the old limit count at the old limit
    // Episodes close together, the first of the run less than `run_min` ago: too short to say what Stripe
    // accepts (a bucket refilled in whole tokens once a second accepts nothing between two ticks), so the
    // dip of the first holds, its curve starting again, without compounding one decrease on another.
    if (decreased_once_ && !slow_start_ && now - last_decrease_ < 2 * cfg_.decrease_hold &&
        (now - run_from_ < cfg_.run_min || run_accepted_ < 1)) {
        last_decrease_ = now;
        last_increase_ = now;
        accepted_since_ = 0;  // the run's answers still count in run_accepted_
        curve_s_ = 0;
        pressed_ = false;
        ++decreases_;
        return;
    }
    // Stripe's bucket is empty at a 429 and was empty at the one before: what it accepted in between, per
    // second, is its rate, whatever the rate was in between (as long as the bucket did not overflow). When
    // the one before is too recent for that, the last second says it, bounded by what was sent (it reads
    // high by the bucket's drain; after a lowered limit it is the lower figure).
    double since = seconds(now - last_decrease_);
    double limit_before = adaptive_;
    double accepted = std::min(recent_accepted_.rate(now), accepted_rate(now));
    if (recent_sent_.first_bin >= 0) accepted = std::min(accepted, recent_sent_.rate(now));
    bool long_cycle = decreased_once_ && since >= seconds(cfg_.long_cycle);
    if (long_cycle)
        accepted = accepted_since_ / since;
    else if (decreased_once_ && since >= 1.0)
        accepted = std::min(accepted, accepted_since_ / since);
    // Not probing (the limit at or below the estimate) and answered since: another sender's probe, or a
    // lowered limit. One such episode lowers the estimate by at most `victim_step`, so a sidecar does not
    // give up its share each time another one probes; a lowered limit brings episodes close together
    // (below).
    bool victim = decreased_once_ && !slow_start_ && !calibrating_ && accepted_since_ > 0 &&
                  adaptive_ <= estimate_ * 1.001;
    double before = estimate_;
    estimate_ = std::max(floor_, std::min(adaptive_, accepted));
    if (victim && cfg_.victim_step > 0) estimate_ = std::max(estimate_, before * (1 - cfg_.victim_step));
    // Episodes close together: Stripe's bucket has been empty since the first of them, so what it accepted
    // since then, per second, is its rate (a lowered limit, found within a second).
    if (decreased_once_ && since < 2 * seconds(cfg_.decrease_hold)) {
        double run = seconds(now - run_from_);
        if (run >= seconds(cfg_.run_min) && !slow_start_)
            estimate_ = std::max(floor_, std::min(estimate_, run_accepted_ / run));
    } else {
        run_from_ = now;
        run_accepted_ = 0;
    }
    accepted_since_ = 0;
    // A reclaim that passed the remembered rate without a 429 says the limit is at least that again.
    if (reclaiming_ && adaptive_ > recalled_) estimate_ = std::max(estimate_, recalled_);
    // The remembered rate: the highest estimate of a full cycle, until `recall` passes without one near it.
    if (long_cycle && !slow_start_) {
        if (estimate_ >= cfg_.reclaim_below * recalled_) {
            recalled_ = std::max(recalled_, estimate_);
            recalled_at_ = now;
        } else if (now - recalled_at_ > cfg_.recall) {
            recalled_ = estimate_;
            recalled_at_ = now;
        }
    }
    // Demand did not reach the limit within `decrease_hold` before this episode: the account was not sending
    // at its limit, so the 429 did not come from its own rate emptying Stripe's bucket (an injected or
    // transient 429, another sender, or a limit lowered below the demand). The limit still drops, but climbs
    // back by doubling under pressure, as in the slow start, until the next 429 measures the rate.
    bool limited = pressed_seen_ && now - pressed_at_ <= cfg_.decrease_hold;
    rebound_ = cfg_.rebound && decreased_once_ && !slow_start_ && !limited;
    // The calibration's 429 came well above what it measured: Stripe's bucket overflowed while the limit
    // climbed from below (a shallow bucket keeps little of what is not sent), so the rate is likely between
    // the two: probe past the estimate faster this cycle.
    fast_probe_to_ = calibrating_ && limit_before > cfg_.fast_probe_above * estimate_ ? limit_before : 0;
    calibrating_ = slow_start_;
    reclaiming_ = !slow_start_ && recalled_ > 0 && estimate_ < cfg_.reclaim_below * recalled_;
    if (slow_start_) {
        estimate_ = std::max(floor_, estimate_ * cfg_.slow_start_exit);
        adaptive_ = estimate_;
    } else if (reclaiming_) {
        adaptive_ = std::max(floor_, estimate_ * cfg_.reclaim_hold_factor);
    } else {
        adaptive_ = std::max(floor_, estimate_ * cfg_.decrease_factor);
    }
    if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
    dip_from_ = adaptive_;
    last_decrease_ = now;
    decreased_once_ = true;
    last_increase_ = now;
    curve_s_ = 0;
    slow_start_ = false;
    pressed_ = false;
    ++decreases_;
}

// The limit curve since the last decrease: back to the estimate in `recover`, then the probe past it.
void rate_control::grow(time_point now) {
    curve_s_ += seconds(now - last_increase_);
    double k = seconds(cfg_.recover);
    double beta = estimate_ > 0 ? std::clamp(dip_from_ / estimate_, 0.0, 1.0) : cfg_.decrease_factor;
    double target;
    if (calibrating_) {
        target = estimate_ * std::exp(cfg_.calibrate_growth * curve_s_);
    } else if (reclaiming_) {
        // Hold just below the estimate long enough that the attempts spend at most `reclaim_budget` of the
        // requests as 429s, then climb to the remembered rate in `reclaim`; reaching it without a 429 says
        // the limit was raised again: keep climbing.
        double hold = 1.0 / (cfg_.reclaim_budget * estimate_);
        double r = seconds(cfg_.reclaim);
        if (curve_s_ < hold) {
            target = adaptive_;
        } else if (curve_s_ < hold + r) {
            target = estimate_ + (recalled_ - estimate_) * (curve_s_ - hold) / r;
        } else {
            target = recalled_ * (1 + cfg_.regrow * (curve_s_ - hold - r));
        }
    } else if (curve_s_ < k) {
        target = estimate_ * (beta + (1 - beta) * curve_s_ / k);
    } else {
        double u = curve_s_ - k;
        target = estimate_ * (1 + cfg_.probe_growth * u * u) + cfg_.increase_rps_per_s * u;
        if (fast_probe_to_ > 0)
            target =
                std::max(target, estimate_ + (fast_probe_to_ - estimate_) * u / seconds(cfg_.fast_probe));
    }
    adaptive_ = std::max(adaptive_, target);
}

void rate_control::on_response(time_point now, bool throttled, time_point sent_at) {
    if (!cfg_.adaptive) return;
    if (!throttled) {
        double w = 1 / share_;
        accepted_.add(now, w);
        recent_accepted_.add(now, w);
        accepted_since_ += w;
        run_accepted_ += w;
    }
    if (throttled) {
        // A request sent before the last decrease belongs to the episode that caused it; one sent since says
        // the decreased limit is still too high.
        if (decreased_once_ && now - last_decrease_ < cfg_.decrease_hold && sent_at <= last_decrease_) return;
        decrease(now);
        ++own_episodes_;
        return;
    }
    if (following_ || std::isinf(adaptive_) || now <= last_increase_) return;
    if (!pressed_) {  // demand did not reach the limit: nothing learned, nothing to grow
        last_increase_ = now;
        return;
    }
    if (slow_start_ || rebound_) {
        // One doubling per step and per round trip: the answer must be to a request sent at the limit in
        // force.
        if (now - last_increase_ < cfg_.slow_start_step) return;
        if (sent_at != time_point{} && sent_at < last_increase_) return;
        refill(now);
        adaptive_ *= 2;
    } else {
        refill(now);
        grow(now);
    }
    if (cfg_.max_rps > 0) adaptive_ = std::min(adaptive_, cfg_.max_rps);
    last_increase_ = now;
    pressed_ = false;
}

}  // namespace cg::stripe
