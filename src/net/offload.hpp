// The offload executor: an io_context run by N threads for work that must not run on the main loop
// (Stripe HTTPS, PQfinish/PQcancel, anything that may block).
#pragma once

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <exception>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "net/boxed.hpp"
#include "net/tokens.hpp"

namespace cg::net {

class offload_pool {
  public:
    // Starts `threads` threads (at least 1) running the pool's io_context.
    explicit offload_pool(unsigned threads = 2);
    ~offload_pool();  // stop() + join()
    offload_pool(const offload_pool&) = delete;
    offload_pool& operator=(const offload_pool&) = delete;

    asio::io_context::executor_type get_executor() noexcept { return ctx_.get_executor(); }
    unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

    // Lets queued work finish, then the threads exit once idle.
    void drain();
    // Stops at once: pending handlers are abandoned.
    void stop();
    void join();

  private:
    asio::io_context ctx_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::vector<std::thread> threads_;
};

// The hand-off between executors. Runs `task` on `ex` (the offload pool, a client's strand) and resumes
// the caller on its own executor with the result; an exception thrown by `task` is rethrown in the caller.
// Cancellation of the caller is not forwarded: `task` must bound itself (timeouts). Forwarding it would
// run `task`'s cancellation handlers on the caller's thread while `task` runs on another (the Asio 1.22
// co_spawn + use_awaitable shape does exactly that), so a caller inside net::with_timeout or net::race
// waits for `task` to end. `task` must own everything it uses.
namespace detail {
using net::boxed;  // net/boxed.hpp; the old name, kept for callers

// co_spawns the task with a handler that has no cancellation slot and dispatches the outcome onto the
// awaiting coroutine's executor.
template <typename Executor>
struct initiate_hand_off {
    Executor ex;
    template <typename Handler, typename U>
    void operator()(Handler&& h, asio::awaitable<U> task) const {
        auto back = asio::get_associated_executor(h);
        if constexpr (std::is_void_v<U>) {
            asio::co_spawn(ex, std::move(task),
                           [h = std::forward<Handler>(h), back](std::exception_ptr e) mutable {
                               asio::dispatch(back, [h = std::move(h), e]() mutable { std::move(h)(e); });
                           });
        } else {
            asio::co_spawn(ex, std::move(task),
                           [h = std::forward<Handler>(h), back](std::exception_ptr e, U v) mutable {
                               asio::dispatch(back, [h = std::move(h), e, v = std::move(v)]() mutable {
                                   std::move(h)(e, std::move(v));
                               });
                           });
        }
    }
};
}  // namespace detail

template <typename Executor, typename T>
asio::awaitable<T> offload(Executor ex, asio::awaitable<T> task) {
    if constexpr (std::is_void_v<T>) {
        co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr)>(
            detail::initiate_hand_off<Executor>{ex}, asio::use_awaitable, std::move(task));
    } else {
        // Boxed: the value travels as an optional, so T need not be default-constructible.
        auto r = co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                               void(std::exception_ptr, std::optional<T>)>(
            detail::initiate_hand_off<Executor>{ex}, asio::use_awaitable, boxed(std::move(task)));
        co_return std::move(*r);
    }
}

}  // namespace cg::net
