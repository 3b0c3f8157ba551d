#include "http/pool_growth.hpp"

#include <algorithm>

namespace cg::http {

namespace {
// Weight of a new exchange in the average: 1/8, so a saturating origin shows within a few answers.
constexpr double alpha = 1.0 / 8.0;
constexpr auto min_bucket = std::chrono::milliseconds(100);
}  // namespace

bool pool_growth::stale(clock::time_point now) const {
    return !seen_ || now - window_start_ >= 2 * c_.window;
}

void pool_growth::exchanged(clock::duration took, clock::time_point now) {
    auto t = std::max<clock::rep>(took.count(), 0);
    if (stale(now)) {
        // First exchange, or none for two windows: what was known is stale.
        seen_ = true;
        ewma_ = static_cast<double>(t);
        min_prev_ = std::numeric_limits<clock::rep>::max();
        min_cur_ = t;
        window_start_ = now;
        n_cur_ = n_prev_ = 0;
        bucket_start_ = now;
        bucket_len_ = std::max<clock::duration>(min_bucket, took);
    } else {
        if (now - window_start_ >= c_.window) {
            min_prev_ = min_cur_;
            min_cur_ = std::numeric_limits<clock::rep>::max();
            window_start_ = now;
        }
        min_cur_ = std::min(min_cur_, t);
        ewma_ += alpha * (static_cast<double>(t) - ewma_);
        if (now - bucket_start_ >= bucket_len_) {
            n_prev_ = now - bucket_start_ < 2 * bucket_len_ ? n_cur_ : 0;
            prev_start_ = bucket_start_;
            n_cur_ = 0;
            bucket_start_ = now;
            bucket_len_ = std::max<clock::duration>(min_bucket, fastest());
        }
    }
    ++n_cur_;
    last_ = t;
    if (paced(now)) credit_ = std::min(c_.max_credit, credit_ + c_.per_answer);
}

pool_growth::clock::duration pool_growth::fastest() const {
    if (!seen_) return clock::duration::zero();
    return clock::duration(std::min(min_cur_, min_prev_));
}

double pool_growth::rate(clock::time_point now) const {
    if (!seen_) return 0;
    // n answers from `first` to `now` are n - 1 intervals; the span is at least a bucket's length, so a
    // burst of first answers does not look like an infinite rate.
    auto first = n_prev_ ? prev_start_ : bucket_start_;
    auto n = n_cur_ + n_prev_;
    auto span = std::max(now - first, bucket_len_);
    return static_cast<double>(n > 1 ? n - 1 : 1) / std::chrono::duration<double>(span).count();
}

double pool_growth::wanted(clock::time_point now) const {
    return c_.headroom * rate(now) * std::chrono::duration<double>(fastest()).count();
}

bool pool_growth::paced(clock::time_point now) const {
    if (stale(now)) return false;
    double limit = c_.ratio * static_cast<double>(fastest().count()) + static_cast<double>(c_.slack.count());
    return ewma_ <= limit && static_cast<double>(last_) <= limit;
}

bool pool_growth::room(std::size_t open, clock::time_point now) const {
    return paced(now) && static_cast<double>(open) < wanted(now);
}

bool pool_growth::eager(std::size_t open) const {
    // A pool without a connection may always open one, whatever `eager` says.
    return open < std::max<std::size_t>(1, c_.eager);
}

bool pool_growth::may_open(std::size_t open, clock::time_point now) const {
    return eager(open) || (credit_ > 0 && room(open, now));
}

bool pool_growth::try_open(std::size_t open, clock::time_point now) {
    if (!may_open(open, now)) return false;
    if (!eager(open)) --credit_;
    return true;
}

}  // namespace cg::http
