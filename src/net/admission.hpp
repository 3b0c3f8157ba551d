// At most `capacity` holders at once; the others wait their turn, oldest first, holding nothing but their
// place in the queue (a waiting coroutine keeps only the frames above its `enter()`).
//
// Used where many callers would otherwise each build a deep chain of state before waiting for a scarce
// resource further down (the Stripe client: thousands of deliveries in flight, a pool of connections a
// hundredth of that): they wait at the entry instead, and the chain exists only for those admitted.
//
// Thread-safe: callers may enter from any executor and a ticket may be dropped on any thread; a waiter is
// resumed on its own executor (the associated executor of its completion handler). A waiter is not
// cancellable: it is admitted when a ticket is dropped. Tickets share the admission's state, so a ticket may
// outlive the admission (a coroutine frame destroyed at shutdown after the object that owned the admission):
// dropping it then does nothing. Destroying the admission destroys the waiters' handlers without running
// them (and with them the waiting coroutines' frames).
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
    struct core;

  public:
    // A held place; dropping it (destructor) admits the oldest waiter, or frees the place.
    class ticket {
      public:
        ticket() = default;
        ticket(ticket&& o) noexcept = default;
        ticket& operator=(ticket&& o) noexcept {
            if (this != &o) {
                release();
                c_ = std::move(o.c_);
            }
            return *this;
        }
        ticket(const ticket&) = delete;
        ticket& operator=(const ticket&) = delete;
        ~ticket() { release(); }
        bool held() const noexcept { return c_ != nullptr; }
        void release() noexcept {
            if (c_) c_->leave();
            c_.reset();
        }

      private:
        friend class admission;
        explicit ticket(std::shared_ptr<core> c) noexcept : c_(std::move(c)) {}
        std::shared_ptr<core> c_;
    };

    // capacity 0 counts as 1.
    explicit admission(std::size_t capacity) : c_(std::make_shared<core>(capacity ? capacity : 1)) {}
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;
    ~admission() {
        std::deque<std::unique_ptr<waiter_base>> dropped;  // destroyed outside the lock
        std::lock_guard lk(c_->m);
        c_->closed = true;
        dropped.swap(c_->waiters);
    }

    // Returns a held ticket: at once when a place is free, else once a ticket is dropped and this caller is
    // the oldest waiter (resumed through its executor's queue). Not cancellable.
    awaitable<ticket> enter() {
        if (c_->try_take()) co_return ticket(c_);
        auto c = c_;  // keeps the state while this caller waits
        // The initiation captures a plain pointer: g++ 12 destroys a closure that is a temporary inside a
        // co_await expression twice, so a capture with a destructor (a shared_ptr copy) would be released
        // twice and the state freed while tickets still point to it.
        core* queue_in = c.get();
        co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
            [queue_in](auto handler) { queue_in->queue(std::move(handler)); }, asio::use_awaitable);
        co_return ticket(std::move(c));  // the place was handed over by leave()
    }

    std::size_t capacity() const noexcept { return c_->capacity; }
    // Holders and waiters now (for metrics and tests; a snapshot under the lock).
    std::size_t held() const {
        std::lock_guard lk(c_->m);
        return c_->capacity - c_->free;
    }
    std::size_t waiting() const {
        std::lock_guard lk(c_->m);
        return c_->waiters.size();
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

    // What the admission and its tickets share.
    struct core {
        explicit core(std::size_t cap) : free(cap), capacity(cap) {}
        mutable std::mutex m;
        std::size_t free;
        const std::size_t capacity;
        bool closed = false;  // the admission is gone: tickets dropped later admit nobody
        std::deque<std::unique_ptr<waiter_base>> waiters;

        bool try_take() {
            std::lock_guard lk(m);
            if (free == 0 || !waiters.empty()) return false;
            --free;
            return true;
        }

        template <typename Handler>
        void queue(Handler h) {
            std::unique_lock lk(m);
            if (free > 0 && waiters.empty()) {  // a place came free since try_take()
                --free;
                lk.unlock();
                asio::post(std::move(h));
                return;
            }
            waiters.push_back(std::make_unique<waiter<Handler>>(std::move(h)));
        }

        // A holder leaves: its place goes straight to the oldest waiter, else back to the free count.
        void leave() noexcept {
            std::unique_ptr<waiter_base> next;
            {
                std::lock_guard lk(m);
                if (closed) return;
                if (waiters.empty()) {
                    ++free;
                    return;
                }
                next = std::move(waiters.front());
                waiters.pop_front();
            }
            next->resume();
        }
    };

    std::shared_ptr<core> c_;
};

}  // namespace cg::net
