// Shared helpers for the NSQ integration tests: a raw protocol client (for byte-exact checks of
// fake-nsqd) and a condition wait on the test's io_context.
#pragma once

#include <asio/read.hpp>
#include <asio/this_coro.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>

#include "core/bytes.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"

namespace nsqtest {

using namespace std::chrono;
using cg::net::nothrow;

// Polls `cond` every 5 ms (on a timer, never blocking the loop) until true; false after `limit`.
inline asio::awaitable<bool> eventually(std::function<bool()> cond, milliseconds limit = seconds(10)) {
    auto end = steady_clock::now() + limit;
    while (!cond()) {
        if (steady_clock::now() > end) co_return false;
        co_await cg::net::sleep_for(milliseconds(5));
    }
    co_return true;
}

struct raw_client {
    explicit raw_client(asio::any_io_executor ex) : sock(ex) {}
    cg::net::tcp_socket sock;

    asio::awaitable<void> connect(std::uint16_t port) {
        auto [ec] = co_await sock.async_connect({asio::ip::make_address("127.0.0.1"), port});
        if (ec) throw std::runtime_error("connect: " + ec.message());
    }
    asio::awaitable<void> send(const std::string& bytes) {
        auto [ec, n] = co_await asio::async_write(sock, asio::buffer(bytes), nothrow);
        if (ec) throw std::runtime_error("send: " + ec.message());
    }
    // Exactly n bytes, or throws (timeout / closed).
    asio::awaitable<std::string> read_n(std::size_t n, milliseconds limit = seconds(5)) {
        std::string out(n, '\0');
        auto r = co_await cg::net::with_timeout(
            asio::async_read(sock, asio::mutable_buffer(out.data(), out.size()), asio::transfer_all(),
                             nothrow),
            limit);
        if (!r) throw std::runtime_error("read timed out");
        auto [ec, got] = *r;
        if (ec) throw std::runtime_error("read: " + ec.message());
        co_return out;
    }
    // One whole frame, header included.
    asio::awaitable<std::string> read_frame(milliseconds limit = seconds(5)) {
        auto hdr = co_await read_n(4, limit);
        auto size = cg::load_be32(reinterpret_cast<const std::uint8_t*>(hdr.data()));
        co_return hdr + co_await read_n(size, limit);
    }
    // True when the peer closed within `limit` (any bytes before that are discarded).
    asio::awaitable<bool> closed_within(milliseconds limit) {
        auto end = steady_clock::now() + limit;
        for (;;) {
            char b[256];
            auto left = end - steady_clock::now();
            if (left <= steady_clock::duration::zero()) co_return false;
            auto r = co_await cg::net::with_timeout(sock.async_read_some(asio::buffer(b)), left);
            if (!r) co_return false;
            auto [ec, n] = *r;
            if (ec) co_return true;
        }
    }
};

}  // namespace nsqtest
