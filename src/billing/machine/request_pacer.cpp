#include "billing/machine/request_pacer.hpp"

#include <algorithm>

namespace cg::billing {

request_pacer::request_pacer(double per_second, unsigned burst)
    : per_second_(per_second), burst_(std::max(1u, burst)), tokens_(burst_) {}

request_pacer::clock::duration request_pacer::delay(clock::time_point now) {
    if (last_)
        tokens_ =
            std::min(burst_, tokens_ + std::chrono::duration<double>(now - *last_).count() * per_second_);
    last_ = now;
    tokens_ -= 1;  // booked now; a negative balance is the wait the next requests inherit
    if (tokens_ >= 0) return clock::duration::zero();
    return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(-tokens_ / per_second_));
}

}  // namespace cg::billing
