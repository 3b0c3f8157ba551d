// The consumer's queue of deliveries waiting for a handler slot.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace cg::nsq {

// Messages waiting for a handler, first in first out: a ring over a power-of-two vector that doubles when
// full (no per-node bookkeeping per message, as a deque has). Holds owning pointers; pop() on an empty
// queue is undefined. Pure.
template <typename T>
class ring_queue {
  public:
    bool empty() const noexcept { return count_ == 0; }
    std::size_t size() const noexcept { return count_; }
    void push(std::unique_ptr<T> m) {
        if (count_ == ring_.size()) grow();
        ring_[(head_ + count_) & (ring_.size() - 1)] = std::move(m);
        ++count_;
    }
    std::unique_ptr<T> pop() noexcept {
        auto m = std::move(ring_[head_]);
        head_ = (head_ + 1) & (ring_.size() - 1);
        --count_;
        return m;
    }
    template <typename F>
    void for_each(F f) {
        for (std::size_t i = 0; i < count_; ++i) f(*ring_[(head_ + i) & (ring_.size() - 1)]);
    }
    // Takes out every message `pred` selects (order kept), handing each to `taken`.
    template <typename Pred, typename Taken>
    void remove_if(Pred pred, Taken taken) {
        std::size_t kept = 0;
        for (std::size_t i = 0; i < count_; ++i) {
            auto& slot = ring_[(head_ + i) & (ring_.size() - 1)];
            if (pred(*slot)) {
                taken(std::move(slot));
            } else {
                ring_[(head_ + kept++) & (ring_.size() - 1)] = std::move(slot);
            }
        }
        count_ = kept;
    }

  private:
    void grow() {
        std::vector<std::unique_ptr<T>> bigger(std::max<std::size_t>(16, ring_.size() * 2));
        for (std::size_t i = 0; i < count_; ++i)
            bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
        ring_ = std::move(bigger);
        head_ = 0;
    }
    std::vector<std::unique_ptr<T>> ring_;
    std::size_t head_ = 0, count_ = 0;
};

}  // namespace cg::nsq
