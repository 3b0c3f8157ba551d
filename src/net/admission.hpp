// At most `capacity` holders at once; the others wait their turn, oldest first, holding nothing but their
// place in the queue (a waiting coroutine keeps only the frames above its `enter()`).
//
// Used where many callers would otherwise each build a deep chain of state before waiting for a scarce
// resource further down (the Stripe client: thousands of deliveries in flight, a pool of connections a
// hundredth of that): they wait at the entry instead, and the chain exists only for those admitted.
//
// Thread-safe: callers may enter from any executor and a ticket may be dropped on any thread; a waiter is
// resumed on its own executor (the associated executor of its completion handler). A waiter is not
// cancellable: it is admitted when a ticket is dropped. Destroying the admission destroys the waiters'
// handlers without running them, so it must outlive every caller that may still be waiting.
#pragma once

#include <asio/async_result.hpp>
#include <asio/post.hpp>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>

#include "net/tokens.hpp"

namespace cg::net {

class admission {
  public:
    // A held place; dropping it (destructor) admits the oldest waiter, or frees the place.
    class ticket {
      public:
        ticket() = default;
        explicit ticket(admission* a) noexcept : a_(a) {}
        ticket(ticket&& o) noexcept : a_(o.a_) { o.a_ = nullptr; }
        ticket& operator=(ticket&& o) noexcept {
            if (this != &o) {
                release();
                a_ = o.a_;
                o.a_ = nullptr;
            }
            return *this;
        }
        ticket(const ticket&) = delete;
        ticket& operator=(const ticket&) = delete;
        ~ticket() { release(); }
        bool held() const noexcept { return a_ != nullptr; }
        void release() noexcept {
            if (a_) a_->leave();
            a_ = nullptr;
        }

      private:
        admission* a_ = nullptr;
    };

    // capacity 0 counts as 1.
    explicit admission(std::size_t capacity) : free_(capacity ? capacity : 1), capacity_(free_) {}
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;

    // Returns a held ticket: at once when a place is free, else once a ticket is dropped and this caller is
    // the oldest waiter (resumed through its executor's queue). Not cancellable.
    awaitable<ticket> enter() {
        if (try_take()) co_return ticket(this);
        co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
            [this](auto handler) { queue(std::move(handler)); }, asio::use_awaitable);
        co_return ticket(this);  // the place was handed over by leave()
    }

    std::size_t capacity() const noexcept { return capacity_; }
    // Holders and waiters now (for metrics and tests; a snapshot under the lock).
    std::size_t held() const {
        std::lock_guard lk(m_);
        return capacity_ - free_;
    }
    std::size_t waiting() const {
        std::lock_guard lk(m_);
        return waiters_.size();
    }

  private:
    struct waiter_base {
        virtual ~waiter_base() = default;
        virtual void resume() = 0;
    };
    template <typename Handler>
    struct waiter final : waiter_base {
        explicit waiter(Handler h) : handler(std::move(h)) {}
        void resume() override { asio::post(std::move(handler)); }
        Handler handler;
    };

    bool try_take() {
        std::lock_guard lk(m_);
        if (free_ == 0 || !waiters_.empty()) return false;
        --free_;
        return true;
    }

    template <typename Handler>
    void queue(Handler h) {
        std::unique_lock lk(m_);
        if (free_ > 0 && waiters_.empty()) {  // a place came free since try_take()
            --free_;
            lk.unlock();
            asio::post(std::move(h));
            return;
        }
        waiters_.push_back(std::make_unique<waiter<Handler>>(std::move(h)));
    }

    // A holder leaves: its place goes straight to the oldest waiter, else back to the free count.
    void leave() noexcept {
        std::unique_ptr<waiter_base> next;
        {
            std::lock_guard lk(m_);
            if (waiters_.empty()) {
                ++free_;
                return;
            }
            next = std::move(waiters_.front());
            waiters_.pop_front();
        }
        next->resume();
    }

    mutable std::mutex m_;
    std::size_t free_;
    std::size_t capacity_;
    std::deque<std::unique_ptr<waiter_base>> waiters_;
};

}  // namespace cg::net
