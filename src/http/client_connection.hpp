// One client-side HTTP/1.1 connection over TCP or TLS: connect (async DNS, TCP, TLS handshake with SNI
// and host verification), then request/response exchanges. Used by one coroutine at a time (the
// client's pool hands it out); owns no timers: callers bound it with `||` timeouts.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "http/origin.hpp"
#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "net/tls.hpp"
#include "net/tls_socket.hpp"
#include "net/tokens.hpp"

namespace cg::http {

class client_connection {
  public:
    // `tls` null → plain TCP. The context must outlive the connection. `sessions` (TLS only, may be null):
    // the origin's session cache — the handshake offers its session and new ones are kept there.
    client_connection(asio::any_io_executor ex, std::shared_ptr<asio::ssl::context> tls,
                      std::shared_ptr<net::tls_session_cache> sessions = nullptr);
    ~client_connection();
    client_connection(const client_connection&) = delete;
    client_connection& operator=(const client_connection&) = delete;

    // Resolves `o.host`, connects to the first endpoint that accepts and, for TLS, handshakes and
    // verifies the certificate against `o.host`. Errors: the resolver/socket code, or
    // net::errc::tls_verify_failed / the TLS code with OpenSSL's reason in the message. Completes on
    // the connection's executor; cancellable through the awaiting coroutine's cancellation slot.
    // DNS, TCP and (for https) the TLS handshake; the lookup alone gives up after `timeout`, and an enclosing
    // `op || timer` cuts the whole of it.
    net::awaitable<result<void>> connect(const origin& o, std::chrono::steady_clock::duration timeout);

    // Writes `req` and reads one response. `*sent` becomes true just before the first byte is written
    // (from then on the server may have acted on the request). Errors: socket codes, or http::errc
    // (connection_closed when the peer closed before a full response, bad_message, body_too_large).
    // `req` and `sent` must outlive the call.
    net::awaitable<result<response>> exchange(const request& req, bool* sent, const parse_limits& limits);

    // True when the last response allows another request on this connection.
    bool reusable() const noexcept { return reusable_; }
    // Closes the socket: a pending connect, handshake, write or read completes with an error at once, and
    // the connection is never reusable again. Safe at any time on the connection's executor.
    void abort() noexcept;
    // Non-blocking check before reuse: the peer has neither closed nor sent anything unsolicited.
    bool idle_alive();
    // After connect(): the TLS handshake resumed a cached session (abbreviated handshake).
    bool resumed() const noexcept { return resumed_; }

    std::chrono::steady_clock::time_point idle_since{};

  private:
    net::tcp_socket& lowest() noexcept;

    std::shared_ptr<asio::ssl::context> tls_ctx_;
    std::shared_ptr<net::tls_session_cache> sessions_;
    std::unique_ptr<net::tls_client_socket> tls_;
    std::unique_ptr<net::tcp_socket> tcp_;
    std::string buf_;          // bytes read past the parser
    std::string out_;          // the serialized request (reused)
    std::vector<char> chunk_;  // read scratch (reused)
    bool reusable_ = false;
    bool resumed_ = false;
};

}  // namespace cg::http
