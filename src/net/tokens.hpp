// Completion tokens and I/O object aliases used across the project.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

namespace cg::net {

// No-throw token: `auto [ec, n] = co_await sock.async_read_some(buf, nothrow);`
// For I/O under net::with_timeout and net::race (net/timeout.hpp): an error (EOF included) is a value.
inline constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
using nothrow_t = std::decay_t<decltype(nothrow)>;

using tcp = asio::ip::tcp;
// I/O objects whose default token is `nothrow`.
using tcp_socket = nothrow_t::as_default_on_t<tcp::socket>;
using tcp_acceptor = nothrow_t::as_default_on_t<tcp::acceptor>;
using tcp_resolver = nothrow_t::as_default_on_t<tcp::resolver>;
using steady_timer = nothrow_t::as_default_on_t<asio::steady_timer>;

template <typename T = void>
using awaitable = asio::awaitable<T>;

}  // namespace cg::net
