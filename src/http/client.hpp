// Generic HTTP/1.1 client for one origin over TCP or TLS, with a keep-alive connection pool.
//
// Threading: every client owns a strand on the executor it is given (normally the offload pool). All
// pool state and all socket I/O run on that strand, so the client is safe to call from any thread or
// executor: request() hops onto the strand and resumes the caller on the caller's executor. One strand
// means one thread at a time does this client's TLS work; make several clients to spread a heavy load.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/ssl/context.hpp>
#include <asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/log.hpp"
#include "core/result.hpp"
#include "http/origin.hpp"
#include "http/pool_growth.hpp"
#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "net/tokens.hpp"

namespace cg::http {

struct client_options {
    // Required for https origins: a context from net::make_tls_client_context (peer verification on;
    // there is deliberately no way to turn it off).
    std::shared_ptr<asio::ssl::context> tls;
    // Connections open at once (idle + busy + connecting). Requests beyond it wait for one to free up.
    std::size_t max_connections = 8;
    // Past growth.eager connections the pool opens another only while the origin keeps its pace (see
    // http/pool_growth.hpp); by default it always may, up to max_connections.
    pool_growth_config growth;
    // DNS + TCP connect + TLS handshake of one new connection.
    std::chrono::steady_clock::duration connect_timeout = std::chrono::seconds(5);
    // Whole request: waiting for a pooled connection, connecting, writing, reading the response.
    std::chrono::steady_clock::duration request_timeout = std::chrono::seconds(30);
    // Idle pooled connections older than this are closed instead of reused.
    std::chrono::steady_clock::duration idle_timeout = std::chrono::seconds(50);
    // Where new connections resolve, connect and (for https) compute their TLS handshake; null: on the
    // client's strand. With the client on the event loop and this on the offload pool, requests on a
    // kept-alive connection never leave the loop while no handshake ever computes on it: the socket stays
    // registered with the client's reactor, only the connect coroutine (and so the handshake's OpenSSL work)
    // runs here, and the connection is handed back once it is established.
    asio::any_io_executor connect_executor;
    parse_limits limits{16 * 1024, 8 * 1024 * 1024};
};

// What one request came to. Either a response (any status) or a transport failure.
struct client_result {
    response resp;              // valid when !err
    cg::error err;              // connect / TLS / timeout / closed / malformed response
    bool request_sent = false;  // false: no byte of the request reached the socket, resending is safe
    bool reused_connection = false;
    bool ok() const noexcept { return !err; }
};

struct client_stats {
    std::uint64_t requests = 0;    // request() calls
    std::uint64_t connects = 0;    // TCP connections established
    std::uint64_t handshakes = 0;  // TLS handshakes completed
    std::uint64_t resumed = 0;     // of which resumed a cached TLS session (no certificate exchanged)
    std::uint64_t reused = 0;      // requests served on a pooled connection
    std::uint64_t open = 0;        // connections open now (idle + busy + connecting)
    std::uint64_t idle = 0;        // idle connections in the pool now
    std::uint64_t held = 0;        // requests that waited for a connection to come back because the pool,
                                   // past growth.eager, held its size (http/pool_growth.hpp)
};

class client {
  public:
    // `base_url` is an origin ("https://api.stripe.com"). Fails on a bad URL or an https origin without
    // `opts.tls`.
    static result<std::unique_ptr<client>> create(asio::any_io_executor ex, std::string_view base_url,
                                                  client_options opts, logger log);
    client(asio::any_io_executor ex, origin o, client_options opts, logger log);
    // Idle connections are closed; requests still running keep the shared state alive until they end.
    ~client();
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    // Sends `req` (origin-form target; Host and Content-Length are filled in) and reads the response.
    // Returns a client_result (never throws for I/O errors; timeouts are errc::timeout in err).
    // Runs on the client's strand and completes on the caller's executor. Cancelling the caller does
    // not stop the request: it is bounded by request_timeout. The client must outlive the call.
    net::awaitable<client_result> request(http::request req);
    // The same, bounded by `deadline` instead of now + request_timeout: a caller that waited for its turn
    // before calling counts that wait against the same bound.
    net::awaitable<client_result> request(http::request req, std::chrono::steady_clock::time_point deadline);

    const http::origin& target() const noexcept;
    const client_options& options() const noexcept;
    // Counters; readable from any thread.
    client_stats stats() const;
    // The strand everything runs on (a Stripe layer may run its own coroutines there too).
    asio::strand<asio::any_io_executor> get_executor() const noexcept;

    struct state;

  private:
    std::shared_ptr<state> st_;
};

}  // namespace cg::http
