// The one helper coroutine tests use: run a coroutine on a fresh io_context with a time limit and
// rethrow whatever it threw.
#pragma once

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>

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
//
// On timeout the coroutine is cancelled and given a grace period to unwind while the caller's frame (which
// its captures may refer to) is still alive: left suspended on `io`, a later run of `io` would resume it
// into dead captures. The completion state is shared, so a coroutine that outlives even the grace period
// writes into live memory.
template <typename Make>
auto run_async(asio::io_context& io, Make&& make,
               std::chrono::steady_clock::duration limit = std::chrono::seconds(30)) {
    using awaitable_t = decltype(make());
    using T = typename awaitable_t::value_type;
    using value_t = std::conditional_t<std::is_void_v<T>, bool, T>;
    struct completion {
        std::exception_ptr err;
        bool done = false;
        std::optional<value_t> out;
        asio::cancellation_signal cancel;  // its slot lives as long as the handler that holds `st`
    };
    auto st = std::make_shared<completion>();
    auto finish = [&]() {
        run_until_done(io, st->done, limit);
        if (!st->done) {
            st->cancel.emit(asio::cancellation_type::all);
            run_until_done(io, st->done, std::chrono::seconds(5));
            throw std::runtime_error("test coroutine did not finish in time");
        }
        if (st->err) std::rethrow_exception(st->err);
    };
    if constexpr (std::is_void_v<T>) {
        asio::co_spawn(io, make(),
                       asio::bind_cancellation_slot(st->cancel.slot(), [st](std::exception_ptr e) {
                           st->err = e;
                           st->done = true;
                       }));
        finish();
    } else {
        asio::co_spawn(io, make(),
                       asio::bind_cancellation_slot(st->cancel.slot(), [st](std::exception_ptr e, T v) {
                           st->err = e;
                           if (!e) st->out.emplace(std::move(v));
                           st->done = true;
                       }));
        finish();
        return std::move(*st->out);
    }
}

template <typename Make>
auto run_async(Make&& make, std::chrono::steady_clock::duration limit = std::chrono::seconds(30)) {
    asio::io_context io;
    return run_async(io, std::forward<Make>(make), limit);
}

}  // namespace cg::test
