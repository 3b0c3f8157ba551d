// Timeouts as `op || timer` (STYLE.md "Timeouts").
#pragma once

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/this_coro.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <variant>

#include "net/tokens.hpp"

namespace cg::net {

// "1500 ms": how timeout messages name a duration.
inline std::string describe_timeout(std::chrono::steady_clock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

// Awaits `op`, or gives up after `d`. Returns the op's value, or nullopt on timeout (the op is then
// cancelled through its cancellation slot). `op` must not throw on ordinary I/O errors: use `nothrow`.
// Completes on the caller's executor.
template <typename T>
asio::awaitable<std::optional<T>> with_timeout(asio::awaitable<T> op, std::chrono::steady_clock::duration d) {
    using namespace asio::experimental::awaitable_operators;
    steady_timer timer(co_await asio::this_coro::executor, d);
    auto r = co_await (std::move(op) || timer.async_wait());
    if (r.index() == 0) co_return std::get<0>(std::move(r));
    co_return std::nullopt;
}

// As above for an operation without a value: true if it finished in time.
inline asio::awaitable<bool> with_timeout(asio::awaitable<void> op, std::chrono::steady_clock::duration d) {
    using namespace asio::experimental::awaitable_operators;
    steady_timer timer(co_await asio::this_coro::executor, d);
    auto r = co_await (std::move(op) || timer.async_wait());
    co_return r.index() == 0;
}

// Sleeps on a timer of the current executor (never a thread sleep). Returns false if cancelled.
inline asio::awaitable<bool> sleep_for(std::chrono::steady_clock::duration d) {
    steady_timer timer(co_await asio::this_coro::executor, d);
    auto [ec] = co_await timer.async_wait();
    co_return !ec;
}

}  // namespace cg::net
