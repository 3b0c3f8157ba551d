// Asio 1.22 work-around, in one place: co_spawn(…, use_awaitable) — and the awaitable operators built on it,
// as with_timeout's `||` — needs a coroutine's value to be default-constructible; result<T> (and most types
// holding one) is not. boxed() runs `task` and returns its value in a std::optional, engaged whenever the
// task completes (an exception propagates instead); unwrap with `*`. Completes on the executor `task` runs
// on; `task` must own what it uses.
#pragma once

#include <asio/awaitable.hpp>
#include <optional>

namespace cg::net {

template <typename T>
asio::awaitable<std::optional<T>> boxed(asio::awaitable<T> task) {
    co_return std::optional<T>(co_await std::move(task));
}

}  // namespace cg::net
