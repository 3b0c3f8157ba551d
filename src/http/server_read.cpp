// How an HTTP server connection reads (http/server_state.hpp): what is there to read, a request head apart
// from its body, a request whole or with its body left in the socket for its handler, within the buffered
// bytes budget; and the lingering close after a refusal.
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <asio/buffer.hpp>
#include <cerrno>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>

#include "http/server_state.hpp"
#include "net/error.hpp"
#include "net/timeout.hpp"

namespace cg::http::server_detail {
namespace {

// Up to `max` bytes of what is there to read (at least one byte is asked for, so a closed peer reads as EOF),
// appended to `buf`: 0 bytes and no error when nothing is there yet. The socket is non-blocking.
std::size_t read_ready(net::tcp_socket& s, std::string& buf, std::size_t max, std::error_code& ec) {
    std::size_t want = std::clamp<std::size_t>(s.available(ec), 1, max);
    if (ec) return 0;
    auto old = buf.size();
    buf.resize(old + want);
    auto n = s.read_some(asio::buffer(buf.data() + old, want), ec);
    buf.resize(old + n);
    if (ec == asio::error::would_block || ec == asio::error::try_again) ec.clear();
    return n;
}

constexpr std::size_t plain_read_max = 16 * 1024;

// How much of what is there to read belongs to a request head: up to and including the first blank line
// in it, else all of it. A head whose end is not in what is there (split across reads, over 16 KiB, bare-LF
// line ends) is read as it comes, and then the body with it: the parser still sees every byte.
std::size_t head_bytes_there(net::tcp_socket& s) {
    thread_local std::array<char, plain_read_max> peeked;
    auto n = ::recv(s.native_handle(), peeked.data(), peeked.size(), MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return plain_read_max;  // EOF or an error: the read reports it
    std::string_view there(peeked.data(), static_cast<std::size_t>(n));
    auto end = there.find("\r\n\r\n");
    return end == std::string_view::npos ? there.size() : end + 4;
}

// One read of what the peer sent, appended to `buf`, within `left`: nullopt on timeout. A plain socket waits
// for readability without a buffer and then reads what is there straight into `buf`, so a connection waiting
// for (the rest of) a request holds no read buffer in its frame; a TLS stream reads through a chunk.
// `head_only` (plain sockets): a body after the head stays in the socket (head_bytes_there).
asio::awaitable<std::optional<std::error_code>> read_more(net::tcp_socket& s, std::string& buf,
                                                          clock::duration left, bool head_only) {
    auto r = co_await net::with_timeout(s.async_wait(net::tcp::socket::wait_read, net::nothrow), left);
    if (!r) co_return std::nullopt;
    auto [ec] = *r;
    if (ec) co_return ec;
    std::error_code rec;
    // Nothing there: reads EOF if the peer closed, else waits again.
    read_ready(s, buf, head_only ? head_bytes_there(s) : plain_read_max, rec);
    co_return rec;
}

asio::awaitable<std::optional<std::error_code>> read_more(net::tls_stream& s, std::string& buf,
                                                          clock::duration left, bool) {
    char chunk[8192];
    auto r = co_await net::with_timeout(s.async_read_some(asio::buffer(chunk), net::nothrow), left);
    if (!r) co_return std::nullopt;
    auto [ec, n] = *r;
    if (!ec) buf.append(chunk, n);
    co_return ec;
}

void half_close(net::tcp_socket& s) {
    std::error_code ignored;
    s.shutdown(net::tcp::socket::shutdown_send, ignored);  // the client sees EOF after our answer at once
}
void half_close(net::tls_stream&) {}  // TLS: close_notify comes later; the linger still protects the answer

}  // namespace

std::optional<std::string> socket_body::read(std::size_t n, bool take) {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
        auto r =
            ::recv(sock_.native_handle(), out.data() + got, n - got, MSG_DONTWAIT | (take ? 0 : MSG_PEEK));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return std::nullopt;
        got += static_cast<std::size_t>(r);
        if (!take && got < n) return std::nullopt;  // a peek sees at once all that is there
    }
    return out;
}

template <typename Stream>
asio::awaitable<read_outcome> read_request(Stream& stream, request_parser& parser, std::string& buf,
                                           clock::duration timeout, buffer_charge& charge,
                                           socket_body* unread) {
    auto deadline = clock::now() + timeout;
    for (;;) {
        if (!buf.empty()) {
            auto used = parser.feed(buf);
            buf.erase(0, used);
            if (parser.state() != parse_state::need_more) co_return read_outcome::message;
        }
        if constexpr (std::is_same_v<Stream, net::tcp_socket>) {
            if (unread && buf.empty()) {
                std::error_code ec;
                auto n = parser.body_left_unfed();
                if (n > 0 && stream.available(ec) >= n && !ec) {
                    auto& req = parser.message();
                    req.unread_body = n;
                    req.unread_from = unread;
                    charge.add(n);
                    co_return charge.over() ? read_outcome::over_budget : read_outcome::message;
                }
            }
        }
        auto left = deadline - clock::now();
        if (left <= clock::duration::zero()) co_return read_outcome::closed;
        const auto before = buf.size();
        auto r = co_await read_more(stream, buf, left, unread != nullptr);
        if (!r) co_return read_outcome::closed;
        charge.add(buf.size() - before);
        if (charge.over()) co_return read_outcome::over_budget;
        auto ec = *r;
        if (ec) {
            if (parser.started()) {
                parser.feed_eof();
                co_return parser.state() != parse_state::need_more ? read_outcome::message
                                                                   : read_outcome::closed;
            }
            co_return read_outcome::closed;
        }
    }
}

template <typename Stream>
asio::awaitable<void> linger(Stream& stream) {
    half_close(stream);
    auto deadline = clock::now() + std::chrono::seconds(2);
    std::size_t budget = 4 * 1024 * 1024;
    char chunk[8192];
    while (budget > 0) {
        auto left = deadline - clock::now();
        if (left <= clock::duration::zero()) break;
        auto r = co_await net::with_timeout(stream.async_read_some(asio::buffer(chunk), net::nothrow), left);
        if (!r || std::get<0>(*r)) break;
        budget -= std::min(budget, std::get<1>(*r));
    }
}

template asio::awaitable<read_outcome> read_request(net::tcp_socket&, request_parser&, std::string&,
                                                    clock::duration, buffer_charge&, socket_body*);
template asio::awaitable<read_outcome> read_request(net::tls_stream&, request_parser&, std::string&,
                                                    clock::duration, buffer_charge&, socket_body*);
template asio::awaitable<void> linger(net::tcp_socket&);
template asio::awaitable<void> linger(net::tls_stream&);

}  // namespace cg::http::server_detail
