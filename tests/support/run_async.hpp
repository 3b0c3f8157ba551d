// The one helper coroutine tests use: run a coroutine on a fresh io_context with a time limit and
// rethrow whatever it threw.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>

namespace cg::test {

// Runs `io` until `done` is set (not until it runs out of work: a server on `io` never does), at most
// `limit`.
inline void run_until_done(asio::io_context& io, const bool& done,
                           std::chrono::steady_clock::duration limit) {
    io.restart();
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done && io.run_one_until(deadline) > 0) {
    }
}

// Runs `make(io)` (a function returning asio::awaitable<T>) to completion on `io`, at most `limit`.
// When the coroutine hands work to other threads (an offload pool), declare `io` before that pool so it
// outlives the pool's threads: they may still release their hold on `io` after the coroutine is done.
// Throws std::runtime_error on timeout; rethrows the coroutine's exception.
template <typename Make>
auto run_async(asio::io_context& io, Make&& make,
               std::chrono::steady_clock::duration limit = std::chrono::seconds(30)) {
    using awaitable_t = decltype(make());
    using T = typename awaitable_t::value_type;
    std::exception_ptr err;
    bool done = false;
    if constexpr (std::is_void_v<T>) {
        asio::co_spawn(io, make(), [&](std::exception_ptr e) {
            err = e;
            done = true;
        });
        run_until_done(io, done, limit);
        if (!done) throw std::runtime_error("test coroutine did not finish in time");
        if (err) std::rethrow_exception(err);
    } else {
        std::optional<T> out;
        asio::co_spawn(io, make(), [&](std::exception_ptr e, T v) {
            err = e;
            if (!e) out.emplace(std::move(v));
            done = true;
        });
        run_until_done(io, done, limit);
        if (!done) throw std::runtime_error("test coroutine did not finish in time");
        if (err) std::rethrow_exception(err);
        return std::move(*out);
    }
}

template <typename Make>
auto run_async(Make&& make, std::chrono::steady_clock::duration limit = std::chrono::seconds(30)) {
    asio::io_context io;
    return run_async(io, std::forward<Make>(make), limit);
}

}  // namespace cg::test
