// The offload executor: an io_context run by N threads for work that must not run on the main loop
// (Stripe HTTPS, PQfinish/PQcancel, anything that may block).
#pragma once

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
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

// An io_context whose services can be shut down (every handler still queued destroyed) before it is
// freed. Two contexts whose handlers refer to each other (a coroutine on the main loop awaiting the
// offload pool holds work on the pool; a task on the pool holds its caller on the main loop) are shut
// down both before either is freed: destroying one's handlers then touches the other while it exists.
// Shutting down twice (the destructor does it again) is harmless.
class shutdown_io_context : public asio::io_context {
  public:
    using asio::io_context::io_context;
    using asio::io_context::shutdown;
};

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
    // After stop() and join(): destroys the abandoned handlers now (see shutdown_io_context).
    void shutdown() { ctx_.shutdown(); }

  private:
    shutdown_io_context ctx_;
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::vector<std::thread> threads_;
};

// A process's (or a test's) main loop and offload pool, torn down together: the pool's threads stopped and
// joined, then the handlers still queued on both contexts destroyed while both exist. Freed one after the
// other instead, a coroutine frame left on the main loop (a pool's maintenance task caught in a connect)
// would hand a connection's PQfinish to a pool already freed.
struct loop_pair {
    shutdown_io_context io{1};
    offload_pool offload;

    explicit loop_pair(unsigned offload_threads = 2) : offload(offload_threads) {}
    loop_pair(const loop_pair&) = delete;
    loop_pair& operator=(const loop_pair&) = delete;
    ~loop_pair() { shut_down(); }

    // Idempotent; an owner whose other members the queued handlers refer to calls it from its own
    // destructor, before those members go.
    void shut_down() {
        offload.stop();
        offload.join();
        io.shutdown();
        offload.shutdown();
    }
};

// The hand-off between executors. Runs `task` on `ex` (the offload pool, a client's strand) and resumes
// the caller on its own executor with the result; an exception thrown by `task` is rethrown in the caller.
// Cancellation of the caller is not forwarded: `task` must bound itself (timeouts). Forwarding it would
// run `task`'s cancellation handlers on the caller's thread while `task` runs on another (the Asio 1.22
// co_spawn + use_awaitable shape does exactly that), so a caller inside net::with_timeout or net::race
// waits for `task` to end. `task` must own everything it uses.
namespace detail {
using net::boxed;  // net/boxed.hpp; the old name, kept for callers

// co_spawn's own use_awaitable hand-back, with the awaiting coroutine's cancellation slot replaced by an
// unconnected one: co_spawn then installs no cancellation handler that another thread could reach.
inline auto no_cancellation_awaitable() {
    return asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
}
}  // namespace detail

template <typename Executor, typename T>
asio::awaitable<T> offload(Executor ex, asio::awaitable<T> task) {
    if constexpr (std::is_void_v<T> || std::is_default_constructible_v<T>) {
        co_return co_await asio::co_spawn(ex, std::move(task), detail::no_cancellation_awaitable());
    } else {
        auto r = co_await asio::co_spawn(ex, boxed(std::move(task)), detail::no_cancellation_awaitable());
        co_return std::move(*r);
    }
}

}  // namespace cg::net
