// Bounded event-loop turns, which bound event-loop lag under saturation.
//
// Asio's io_context runs every handler that is ready, then polls sockets and timers once, then runs what
// that made ready: a "turn". A timer that expires during a turn waits for the turn's end, so the turn's
// length is the loop's lag. With hundreds of deliveries in flight the work arrives in bursts (a
// group-commit statement answers for 100-250 rows at once, an NSQ read brings a wave of messages, Stripe
// answers complete together) and one turn runs them all: 5-25 ms with heartbeats, TOUCH timers and lease
// renewals behind it.
//
// A turn_budget gives each turn a time budget for deliveries' steps. Code where a delivery's next step
// starts asks `spent()`; once the turn has run longer than the budget (or steps are already waiting), the
// step waits in the budget's queue (`next_turn()`). Once per turn the queue is drained, oldest first,
// until the budget is spent again: at the start of the turn, ahead of the sockets and timers that turn's
// poll made ready, which then run. A turn so lasts about the budget plus whatever ran without asking (one
// statement's result parsing, one socket read), and steps are never dropped, only delayed, in order.
//
// There is no hook for "the loop polled". A turn is taken to start when the queue is drained (its handler
// is posted from a handler, so it runs after the next poll), or when no step asked for longer than the
// budget (the loop was idle, or in work nothing here can cut).
//
// One per io_context (an Asio service): `turn_budget::of(executor)`. Off (budget 0) unless set; used only
// from the thread running that context.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "net/tokens.hpp"

namespace cg::net {

class turn_budget {
  public:
    using clock = std::chrono::steady_clock;

    // The budget of the io_context `ex` runs on (created off on first use). The reference stays valid for
    // the io_context's lifetime.
    static turn_budget& of(const asio::any_io_executor& ex);

    // 0: off (spent() is always false). Set before the loop runs.
    void set(std::chrono::microseconds budget) noexcept { budget_ = budget; }
    std::chrono::microseconds budget() const noexcept { return budget_; }

    // Called for every step sent to a later turn (metrics); may be empty.
    void on_defer(std::function<void()> f) { on_defer_ = std::move(f); }

    // True when the step about to start should wait for a later turn: the current turn has run past the
    // budget, or earlier steps are waiting. The caller then awaits next_turn(). Loop thread only.
    bool spent() {
        if (budget_.count() == 0) return false;
        if (!waiting_.empty()) return true;
        auto now = clock::now();
        if (now - last_ask_ > budget_) turn_start_ = now;  // idle, or uncut work, since the last step
        last_ask_ = now;
        return now - turn_start_ >= budget_;
    }

    // Completes when the budget's queue reaches this step, on a later turn (in order of the calls): the
    // step resumes inside the drain, on the io_context's thread, so call it from a coroutine on the
    // io_context's own executor (a strand's guarantee would not hold). Not cancellable; a step still
    // queued when the io_context shuts down is destroyed with it. The budget outlives every caller.
    awaitable<void> next_turn() {
        return asio::async_initiate<decltype(asio::use_awaitable), void()>(
            [this](auto handler) {
                enqueue(std::make_unique<step_of<decltype(handler)>>(std::move(handler)));
            },
            asio::use_awaitable);
    }

    // Steps sent to a later turn so far, and steps waiting now.
    std::uint64_t deferred() const noexcept { return deferred_; }
    std::size_t waiting() const noexcept { return waiting_.size(); }

  private:
    // A step waiting for its turn: its completion handler (move-only), in one allocation.
    struct step {
        virtual ~step() = default;
        virtual void resume() = 0;
    };
    template <typename Handler>
    struct step_of final : step {
        explicit step_of(Handler&& h) : handler(std::move(h)) {}
        void resume() override { std::move(handler)(); }
        Handler handler;
    };

    friend class turn_budget_service;
    turn_budget() = default;
    void enqueue(std::unique_ptr<step> s);
    void post_drain();
    void drain();
    void shutdown() { waiting_.clear(); }

    asio::any_io_executor ex_;
    std::chrono::microseconds budget_{0};
    clock::time_point turn_start_{}, last_ask_{};
    std::deque<std::unique_ptr<step>> waiting_;
    bool drain_posted_ = false;
    std::uint64_t deferred_ = 0;
    std::function<void()> on_defer_;
};

}  // namespace cg::net
