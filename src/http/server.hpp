// Coroutine HTTP/1.1 server (plain TCP or TLS) with keep-alive, pipelining and size limits.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <memory>

#include "core/log.hpp"
#include "core/result.hpp"
#include "http/proto/parser.hpp"
#include "http/router.hpp"
#include "metrics/registry.hpp"
#include "net/address.hpp"
#include "net/tokens.hpp"

namespace cg::http {

struct server_options {
    parse_limits limits;
    // A connection with no complete request for this long is closed (slowloris guard).
    std::chrono::steady_clock::duration read_timeout = std::chrono::seconds(30);
    // A new connection must finish its TLS handshake within this...
    std::chrono::steady_clock::duration handshake_timeout = std::chrono::seconds(5);
    // ...and send its first complete request head within this of being accepted (bounded by read_timeout).
    std::chrono::steady_clock::duration first_request_timeout = std::chrono::seconds(10);
    // At this many open connections, a new one sheds the oldest connection that has not yet completed a
    // request (idle, or mid-handshake, or trickling a request head), else the oldest kept-alive connection
    // waiting between requests; only when every open connection is in the middle of a request is the new
    // one refused. So a flood of connections that never send a byte (or send one request and idle) cannot
    // lock well-behaved clients out: it can only displace itself. The same shedding frees a descriptor when
    // accept fails with EMFILE/ENFILE.
    std::size_t max_connections = 512;
    // Bytes of requests read but not yet answered, across every connection (0: no global budget). A read
    // that takes the total over it is answered 503 (Retry-After) and its connection closed, whatever the
    // per-request limits allow, so memory is bounded by this and max_connections, not by what clients
    // send. The body strings grow by doubling, so the heap they take is up to twice this.
    std::size_t max_buffered_bytes = 0;
    // When set, what the listener sheds is counted in chargeguard_http_shed_total{listener, reason}:
    // reason buffered_bytes (a request answered 503 over max_buffered_bytes), make_room (a connection closed
    // to make room for a new one) and refused (a new connection refused). The registry must outlive the
    // server; `listener` names it (webhooks, proxy).
    metrics::registry* metrics = nullptr;
    std::string listener;
    // Serve TLS when set (test doubles use it for HTTPS).
    std::shared_ptr<asio::ssl::context> tls;
    std::string server_name = "chargeguard";
};

class server {
  public:
    server(asio::any_io_executor ex, router routes, server_options opts, logger log);
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    // Binds and listens (port 0 → ephemeral). Does not accept until start().
    result<net::tcp::endpoint> listen(const net::host_port& where);
    // Starts the accept loop on the executor. Completes nothing; stop() ends it.
    void start();
    // Closes the listener and every open connection. In-progress handlers finish but their responses
    // are dropped. Safe to call more than once; must be called on the server's executor.
    void stop();

    net::tcp::endpoint local_endpoint() const;
    std::size_t open_connections() const;
    // Connections closed to make room (max_connections reached, or out of descriptors) since start.
    std::uint64_t shed_connections() const;
    // New connections refused because every open one had completed a request.
    std::uint64_t refused_connections() const;
    // Bytes of requests read and not yet answered now, and requests refused for max_buffered_bytes since
    // start.
    std::size_t buffered_bytes() const;
    std::uint64_t over_budget_requests() const;

    struct state;  // shared with connection coroutines; opaque

  private:
    std::shared_ptr<state> st_;
};

}  // namespace cg::http
