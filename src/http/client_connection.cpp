#include "http/client_connection.hpp"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/ssl/error.hpp>
#include <asio/write.hpp>
#include <cerrno>
#include <vector>

#include "http/proto/error.hpp"
#include "net/error.hpp"
#include "net/resolve.hpp"

namespace cg::http {

client_connection::client_connection(asio::any_io_executor ex, std::shared_ptr<asio::ssl::context> tls,
                                     std::shared_ptr<net::tls_session_cache> sessions)
    : tls_ctx_(std::move(tls)), sessions_(std::move(sessions)) {
    if (tls_ctx_) {
        // OpenSSL on the socket itself, its record buffers freed whenever they are empty: a connection
        // waiting for its response, or idle in the pool, holds its SSL state alone (net/tls_socket.hpp).
        tls_ = std::make_unique<net::tls_client_socket>(ex, *tls_ctx_);
    } else
        tcp_ = std::make_unique<net::tcp_socket>(ex);
}

client_connection::~client_connection() {
    // Closing without close_notify: the peer treats it as a plain disconnect, which is what an HTTP/1.1
    // client does when it drops an idle keep-alive connection.
    std::error_code ignored;
    lowest().close(ignored);
}

net::tcp_socket& client_connection::lowest() noexcept {
    return tls_ ? tls_->next_layer() : *tcp_;
}

net::awaitable<result<void>> client_connection::connect(const origin& o,
                                                        std::chrono::steady_clock::duration timeout) {
    auto endpoints = co_await net::resolve(o.host, std::to_string(o.port), timeout);
    if (!endpoints) co_return endpoints.err();

    auto [cec, ep] = co_await asio::async_connect(lowest(), *endpoints);
    if (cec) co_return error(cec, "connect to " + o.to_string() + ": " + cec.message());
    std::error_code ignored;
    lowest().set_option(net::tcp::no_delay(true), ignored);
    if (!tls_) co_return result<void>{};

    if (auto p = net::prepare_tls_client(tls_->native_handle(), o.host); !p) co_return p.err();
    if (sessions_) sessions_->attach(tls_->native_handle());
    auto [hec] = co_await tls_->async_handshake(net::nothrow);
    if (hec) {
        bool verify = SSL_get_verify_result(tls_->native_handle()) != X509_V_OK;
        std::string why = "TLS handshake with " + o.to_string() +
                          " failed: " + net::describe_tls_error(tls_->native_handle(), hec);
        if (verify) co_return error(net::errc::tls_verify_failed, std::move(why));
        co_return error(hec, std::move(why));
    }
    resumed_ = net::tls_session_resumed(tls_->native_handle());
    co_return result<void>{};
}

namespace {

// `out` and `chunk` are the connection's scratch buffers, kept between exchanges: a keep-alive connection
// serializes and reads without allocating, and no read array lands in this coroutine's heap frame. `chunk`
// is small (a create call's response fits) while the connection waits for an answer, which is most of its
// life; a read that fills it means a large response (a list page), read on in TLS-record-sized reads, and
// the large array is given back once that response is complete.
constexpr std::size_t small_read = 4 * 1024;
constexpr std::size_t large_read = 16 * 1024;

template <typename Stream>
net::awaitable<result<response>> exchange_on(Stream& stream, std::string& buf, std::string& out,
                                             std::vector<char>& chunk, const request& req, bool* sent,
                                             const parse_limits& limits, bool& reusable) {
    reusable = false;
    out.clear();
    serialize(req, out);
    *sent = true;
    auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(out), net::nothrow);
    if (wec) co_return error(wec, "write request: " + wec.message());

    response_parser parser(limits);
    parser.expect_no_body(req.method == "HEAD");
    for (;;) {
        if (!buf.empty()) {
            auto used = parser.feed(buf);
            buf.erase(0, used);
            if (parser.state() == parse_state::done) break;
            if (parser.state() == parse_state::failed)
                co_return error(parser.error(), "response: " + parser.error_detail());
        }
        if (chunk.size() < small_read) chunk.resize(small_read);
        auto [rec, n] = co_await stream.async_read_some(asio::buffer(chunk), net::nothrow);
        if (rec) {
            // EOF (or a TLS stream truncated by the peer) may end a read-until-close body.
            parser.feed_eof();
            if (parser.state() == parse_state::done) break;
            if (rec == asio::error::eof || rec == asio::ssl::error::stream_truncated)
                co_return error(errc::connection_closed, parser.started() ? "peer closed mid-response"
                                                                          : "peer closed before responding");
            co_return error(rec, "read response: " + rec.message());
        }
        buf.append(chunk.data(), n);
        if (n == chunk.size() && chunk.size() < large_read) chunk.resize(large_read);
    }
    if (chunk.size() > small_read) std::vector<char>(small_read).swap(chunk);
    response resp = std::move(parser.message());
    // Bytes after a complete response were never asked for: the connection is out of sync.
    reusable = resp.keep_alive() && buf.empty();
    co_return resp;
}

}  // namespace

net::awaitable<result<response>> client_connection::exchange(const request& req, bool* sent,
                                                             const parse_limits& limits) {
    if (tls_) co_return co_await exchange_on(*tls_, buf_, out_, chunk_, req, sent, limits, reusable_);
    co_return co_await exchange_on(*tcp_, buf_, out_, chunk_, req, sent, limits, reusable_);
}

void client_connection::abort() noexcept {
    reusable_ = false;
    std::error_code ignored;
    lowest().close(ignored);
}

bool client_connection::idle_alive() {
    if (!lowest().is_open()) return false;
    char c;
    ssize_t n = ::recv(lowest().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    // Nothing to read is the only healthy state: 0 is EOF, data is a close_notify or garbage.
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace cg::http
