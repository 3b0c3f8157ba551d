// The offload executor: an io_context run by N threads for work that must not run on the main loop
// (Stripe HTTPS, PQfinish/PQcancel, anything that may block).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
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

// Runs `task` on `ex` (typically offload_pool::get_executor()) and resumes the caller on its own
// executor with the result; an exception thrown by `task` is rethrown in the caller. Cancellation of the
// caller is not forwarded: `task` must bound itself (timeouts). `task` must own everything it uses.
namespace detail {
using net::boxed;  // net/boxed.hpp; the old name, kept for callers
}  // namespace detail

template <typename Executor, typename T>
asio::awaitable<T> offload(Executor ex, asio::awaitable<T> task) {
    if constexpr (std::is_void_v<T> || std::is_default_constructible_v<T>) {
        co_return co_await asio::co_spawn(ex, std::move(task), asio::use_awaitable);
    } else {
        auto r = co_await asio::co_spawn(ex, boxed(std::move(task)), asio::use_awaitable);
        co_return std::move(*r);
    }
}

}  // namespace cg::net
