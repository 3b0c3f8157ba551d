#include "nsq/http_get.hpp"

#include <asio/this_coro.hpp>
#include <asio/write.hpp>

#include "http/proto/parser.hpp"
#include "net/boxed.hpp"
#include "net/resolve.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq {
namespace {

asio::awaitable<result<http::response>> exchange(net::host_port where, std::string target,
                                                 std::string accept) {
    auto ex = co_await asio::this_coro::executor;
    // The caller's with_timeout bounds the whole exchange; its cancellation also ends the lookup's wait.
    auto eps = co_await net::resolve(where.host, std::to_string(where.port), std::chrono::seconds(30));
    if (!eps) co_return eps.err();
    net::tcp_socket sock(ex);
    std::error_code cec = asio::error::host_unreachable;
    for (const auto& e : *eps) {
        std::error_code ignored;
        sock.close(ignored);
        std::tie(cec) = co_await sock.async_connect(e.endpoint());
        if (!cec) break;
    }
    if (cec) co_return error(cec, "connect " + where.to_string());

    http::request req;
    req.method = "GET";
    req.target = std::move(target);
    req.headers.add("Host", where.to_string());
    req.headers.add("Accept", accept);
    req.headers.add("Connection", "close");
    std::string out;
    http::serialize(req, out);
    auto [wec, wn] = co_await asio::async_write(sock, asio::buffer(out), net::nothrow);
    if (wec) co_return error(wec, "write request");

    http::response_parser parser;
    char buf[8192];
    for (;;) {
        auto [ec, n] = co_await sock.async_read_some(asio::buffer(buf));
        if (ec) {
            parser.feed_eof();
        } else {
            parser.feed(std::string_view(buf, n));
        }
        if (parser.state() == http::parse_state::done) co_return std::move(parser.message());
        if (parser.state() == http::parse_state::failed)
            co_return error(parser.error(),
                            "response from " + where.to_string() + ": " + parser.error_detail());
        if (ec) co_return error(errc::connection_closed, "response from " + where.to_string() + " cut short");
    }
}

}  // namespace

asio::awaitable<result<http::response>> http_get(net::host_port where, std::string target, std::string accept,
                                                 std::chrono::milliseconds timeout) {
    auto name = where.to_string();
    // Boxed: with_timeout's || needs a default-constructible value (net/boxed.hpp).
    auto r = co_await net::with_timeout(
        net::boxed(exchange(std::move(where), std::move(target), std::move(accept))), timeout);
    if (!r) co_return error(errc::timeout, "GET from " + name + " timed out");
    co_return std::move(**r);
}

}  // namespace cg::nsq
