// The one timeout and race primitive of the code base (docs/contributing.md "Timeouts").
//
// Asio 1.22's awaitable operators (`a || b`, `a && b`: a parallel_group) emit cancellation into branches
// whose handlers may already be gone: when a branch ends by exception, or completes on another thread, the
// group's signal reaches a slot whose handler was destroyed ("invalid vptr" in cancellation_signal::emit).
// None of them is used here.
//
// with_timeout: the operation is co_spawned on the awaiting coroutine's executor with a cancellation_signal
// bound to it (bind_cancellation_slot); a timer on the same executor emits the signal, and only while the
// operation has not completed. The signal lives in a state shared with the timer's handler, so a handler
// that runs late finds it alive.
// race / all_of: each branch is co_spawned on the awaiting coroutine's executor with a signal of its own,
// emitted only while that branch runs, from handlers of that one executor.
//
// Precondition: the awaiting coroutine runs on a serial executor (an io_context run by one thread, or a
// strand; race and all_of are used only on the event loop). Work that finishes on another executor (the
// offload pool, a client's strand) is awaited through net::offload (net/offload.hpp), which hands its
// result back without forwarding cancellation across threads.
#pragma once

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "net/boxed.hpp"
#include "net/tokens.hpp"

namespace cg::net {

// "1500 ms": how timeout messages name a duration.
inline std::string describe_timeout(std::chrono::steady_clock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

namespace detail {

// When a group cancels the branches still running.
enum class group_end {
    first_completion,  // a race: the first branch to complete (or throw) ends the others
    first_exception,   // all of them: only a branch that throws ends the others
};

inline constexpr std::size_t no_branch = std::numeric_limits<std::size_t>::max();

// An operation_aborted system_error: what a cancelled coroutine throws when it awaits again after the
// cancellation (Asio's throw_if_cancelled).
inline bool is_abort(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::system_error& se) {
        return se.code() == asio::error::operation_aborted;
    } catch (...) {
        return false;
    }
}

// Runs branches on one executor and completes `Handler` with (exception, first branch done, timed out)
// once every branch has completed. The exception is the first one thrown, except that an abort thrown
// after the group (or its awaiting coroutine) cancelled the branches is the cancellation taking effect,
// not a failure: like the value of a branch cut short, it is dropped. Touched only on that executor, except
// that the state outlives the awaiting coroutine while a handler (a branch's, the timer's) still refers to
// it.
template <typename Handler>
class group_op : public std::enable_shared_from_this<group_op<Handler>> {
  public:
    group_op(Handler h, const asio::any_io_executor& ex, std::size_t n, group_end end)
        : handler_(std::move(h)),
          ex_(ex),
          signals_(new asio::cancellation_signal[n]),
          done_(n, false),
          left_(n),
          end_(end),
          timer_(ex) {}

    void start(std::vector<asio::awaitable<void>> branches,
               std::optional<std::chrono::steady_clock::duration> timeout) {
        auto self = this->shared_from_this();
        // The awaiting coroutine's own cancellation reaches every branch still running.
        outer_ = asio::get_associated_cancellation_slot(handler_);
        if (outer_.is_connected()) {
            outer_.assign([this](asio::cancellation_type t) { cancel_running(t); });
        }
        if (timeout) {
            timer_.expires_after(*timeout);
            timer_.async_wait([self](std::error_code ec) { self->expired(ec); });
        }
        for (std::size_t i = 0; i < branches.size(); ++i) {
            asio::co_spawn(ex_, std::move(branches[i]),
                           asio::bind_cancellation_slot(signals_[i].slot(), [self, i](std::exception_ptr e) {
                               // Outside co_spawn's own completion: the branch's coroutine is gone then.
                               asio::post(self->ex_, [self, i, e] { self->branch_done(i, e); });
                           }));
        }
    }

  private:
    void expired(std::error_code ec) {
        if (ec || finished_ || left_ == 0) return;
        timed_out_ = true;
        cancel_running(asio::cancellation_type::all);
    }

    void branch_done(std::size_t i, std::exception_ptr e) {
        done_[i] = true;
        --left_;
        if (e && !error_ && !(cancelled_ && is_abort(e))) error_ = e;
        if (first_ == no_branch) first_ = i;
        if (end_ == group_end::first_completion || e) cancel_running(asio::cancellation_type::all);
        if (left_ == 0 && !finished_) finish();
    }

    // Emits only into branches that have not completed: a completed branch's slot may hold a handler of an
    // operation that no longer exists.
    void cancel_running(asio::cancellation_type t) {
        cancelled_ = true;
        for (std::size_t j = 0; j < done_.size(); ++j)
            if (!done_[j] && !finished_) signals_[j].emit(t);
    }

    void finish() {
        finished_ = true;
        timer_.cancel();
        if (outer_.is_connected()) outer_.clear();
        auto back = asio::get_associated_executor(handler_, ex_);
        asio::post(back, [h = std::move(handler_), e = error_, first = first_, t = timed_out_]() mutable {
            std::move(h)(e, first, t);
        });
    }

    Handler handler_;
    asio::any_io_executor ex_;
    std::unique_ptr<asio::cancellation_signal[]> signals_;  // one per branch, bound to it
    std::vector<bool> done_;
    std::size_t left_;
    group_end end_;
    asio::steady_timer timer_;
    asio::cancellation_slot outer_;
    std::exception_ptr error_;
    std::size_t first_ = no_branch;
    bool timed_out_ = false;
    bool cancelled_ = false;  // a cancellation was emitted into the branches
    bool finished_ = false;
};

struct initiate_group {
    asio::any_io_executor ex;
    group_end end;
    template <typename Handler>
    void operator()(Handler&& h, std::vector<asio::awaitable<void>> branches,
                    std::optional<std::chrono::steady_clock::duration> timeout) const {
        using op = group_op<std::decay_t<Handler>>;
        auto n = branches.size();
        std::make_shared<op>(std::forward<Handler>(h), ex, n, end)->start(std::move(branches), timeout);
    }
};

// Awaits every branch; (index of the first to complete, whether the timeout ended them). Rethrows the
// first exception of a branch once all have completed.
inline asio::awaitable<std::tuple<std::size_t, bool>> run_group(
    std::vector<asio::awaitable<void>> branches, group_end end,
    std::optional<std::chrono::steady_clock::duration> timeout) {
    auto ex = co_await asio::this_coro::executor;
    // Named, not a temporary in the co_await: g++ 12 destroys an aggregate temporary inside a co_await
    // expression twice, and a strand's executor releases its shared state on destruction.
    const initiate_group init{ex, end};
    auto r = co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                           void(std::exception_ptr, std::size_t, bool)>(
        init, asio::use_awaitable, std::move(branches), timeout);
    co_return r;
}

template <typename... A>
std::vector<asio::awaitable<void>> branch_list(A&&... a) {
    std::vector<asio::awaitable<void>> v;
    v.reserve(sizeof...(A));
    (v.push_back(std::forward<A>(a)), ...);
    return v;
}

// The state of one with_timeout: shared by the awaiting coroutine and the timer's handler, so a handler
// that runs late finds the signal alive. Touched only on the awaiting coroutine's executor.
struct timeout_state {
    explicit timeout_state(const asio::any_io_executor& ex) : timer(ex) {}
    asio::cancellation_signal signal;  // bound to the operation
    asio::steady_timer timer;
    bool done = false;   // the operation has completed: nothing is emitted any more
    bool fired = false;  // the timeout passed first
};

template <typename T>
asio::awaitable<T> run_bounded(asio::awaitable<T> op, std::chrono::steady_clock::duration d,
                               std::shared_ptr<timeout_state> st) {
    auto ex = co_await asio::this_coro::executor;
    st->timer.expires_after(d);
    st->timer.async_wait([st](std::error_code ec) {
        if (ec || st->done) return;
        st->fired = true;
        st->signal.emit(asio::cancellation_type::all);
    });
    // The awaiting coroutine's own cancellation reaches the operation too (a timeout inside a timeout).
    asio::cancellation_state outer = co_await asio::this_coro::cancellation_state;
    if (outer.slot().is_connected()) {
        outer.slot().assign([st](asio::cancellation_type t) {
            if (!st->done) st->signal.emit(t);
        });
    }
    struct finish {
        timeout_state& st;
        asio::cancellation_state& outer;
        ~finish() {
            st.done = true;
            st.timer.cancel();
            if (outer.slot().is_connected()) outer.slot().clear();
        }
    };
    finish f{*st, outer};
    co_return co_await asio::co_spawn(ex, std::move(op),
                                      asio::bind_cancellation_slot(st->signal.slot(), asio::use_awaitable));
}

}  // namespace detail

// Awaits `op`, or gives up after `d`. Returns the op's value, or nullopt on timeout: the op is then
// cancelled through its cancellation slot and awaited to its end (so nothing it uses outlives it), and
// its value, if it still produced one, is dropped. An exception of `op` propagates (but not the abort a
// cancelled coroutine throws). `op` should use the no-throw token for I/O (`nothrow`), so an I/O error is
// a value and not an exception. Completes on the caller's executor.
//
// The shape: `op` is co_spawned on the caller's executor with a cancellation_signal bound to it; a timer on
// that executor emits the signal, only while `op` has not completed.
template <typename T>
asio::awaitable<std::optional<T>> with_timeout(asio::awaitable<T> op, std::chrono::steady_clock::duration d) {
    auto st = std::make_shared<detail::timeout_state>(co_await asio::this_coro::executor);
    std::optional<T> v;
    try {
        auto r = co_await detail::run_bounded(net::boxed(std::move(op)), d, st);
        if (r) v.emplace(std::move(*r));
    } catch (...) {
        if (!(st->fired && detail::is_abort(std::current_exception()))) throw;
    }
    if (st->fired) co_return std::nullopt;
    co_return v;
}

// As above for an operation without a value: true if it finished in time.
inline asio::awaitable<bool> with_timeout(asio::awaitable<void> op, std::chrono::steady_clock::duration d) {
    auto st = std::make_shared<detail::timeout_state>(co_await asio::this_coro::executor);
    try {
        co_await detail::run_bounded(std::move(op), d, st);
    } catch (...) {
        if (!(st->fired && detail::is_abort(std::current_exception()))) throw;
    }
    co_return !st->fired;
}

// Runs the coroutines together on the caller's executor; when the first completes (or throws), the
// others are cancelled and awaited to their end. Returns the index of the first to complete; an exception
// propagates once all have ended (not the abort a cancelled coroutine throws). The replacement for `a || b ||
// …`.
template <typename... A>
asio::awaitable<std::size_t> race(asio::awaitable<void> first, A... rest) {
    auto [i, timed_out] =
        co_await detail::run_group(detail::branch_list(std::move(first), std::move(rest)...),
                                   detail::group_end::first_completion, std::nullopt);
    (void)timed_out;
    co_return i;
}

// Runs the coroutines together on the caller's executor and awaits them all; if one throws, the others
// are cancelled, awaited, and the exception propagates. The replacement for `a && b && …`.
template <typename... A>
asio::awaitable<void> all_of(asio::awaitable<void> first, A... rest) {
    (void)co_await detail::run_group(detail::branch_list(std::move(first), std::move(rest)...),
                                     detail::group_end::first_exception, std::nullopt);
}

// Sleeps on a timer of the current executor (never a thread sleep). Returns false if cancelled.
inline asio::awaitable<bool> sleep_for(std::chrono::steady_clock::duration d) {
    steady_timer timer(co_await asio::this_coro::executor, d);
    auto [ec] = co_await timer.async_wait();
    co_return !ec;
}

}  // namespace cg::net
