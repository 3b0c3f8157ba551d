// server::state and how a connection reads a request (server_read.cpp), shared by the server's files:
// server.cpp (accept, connections, serving, shedding) and server_read.cpp. Internal to the http module. The
// server's executor only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>

#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "http/server.hpp"
#include "net/tls.hpp"

namespace cg::http {

struct server::state {
    struct conn {
        net::tcp_socket* sock;
        bool served = false;   // completed at least one request: shed only once idle, after the rest
        bool between = false;  // served, and waiting for its next request (no request being handled)
        bool shed = false;     // closed to make room; its coroutine has not yet unregistered it
    };
    asio::any_io_executor ex;
    router routes;
    server_options opts;
    logger log;
    net::tcp_acceptor acceptor;
    bool stopped = false;
    std::list<conn> conns;  // in accept order (oldest first); touched only on ex
    std::size_t shed_pending = 0;
    std::uint64_t shed_total = 0, refused_total = 0;
    std::size_t buffered = 0;  // bytes of requests read and not yet answered (max_buffered_bytes)
    std::uint64_t over_budget_total = 0;
    // chargeguard_http_shed_total by reason, when the options name a registry.
    metrics::Counter* shed_over_budget = nullptr;
    metrics::Counter* shed_make_room = nullptr;
    metrics::Counter* shed_refused = nullptr;

    state(asio::any_io_executor e, router r, server_options o, logger l)
        : ex(e), routes(std::move(r)), opts(std::move(o)), log(std::move(l)), acceptor(e) {
        if (!opts.metrics) return;
        auto& fam = opts.metrics->counter(
            "chargeguard_http_shed_total",
            "What an HTTP listener shed, by listener and reason: buffered_bytes (a request answered 503 over "
            "the budget of bytes buffered across connections), make_room (a connection closed for a new "
            "one), "
            "refused (a new connection refused, every open one in a request)");
        shed_over_budget = &fam.Add({{"listener", opts.listener}, {"reason", "buffered_bytes"}});
        shed_make_room = &fam.Add({{"listener", opts.listener}, {"reason", "make_room"}});
        shed_refused = &fam.Add({{"listener", opts.listener}, {"reason", "refused"}});
    }

    static void count(metrics::Counter* c) {
        if (c) c->Increment();
    }
};

namespace server_detail {

using clock = std::chrono::steady_clock;

// What one connection holds of server::state::buffered: charged as bytes are read, given back when the
// request they belong to has been answered, or when the connection ends.
struct buffer_charge {
    server::state& st;
    std::size_t held = 0;
    explicit buffer_charge(server::state& s) : st(s) {}
    ~buffer_charge() { st.buffered -= held; }
    buffer_charge(const buffer_charge&) = delete;
    buffer_charge& operator=(const buffer_charge&) = delete;
    void add(std::size_t n) {
        held += n;
        st.buffered += n;
    }
    // The request was answered: what is still in the read buffer (a pipelined next request) stays charged.
    void settle(std::size_t still_read) {
        st.buffered -= held;
        held = 0;
        add(still_read);
    }
    bool over() const { return st.opts.max_buffered_bytes > 0 && st.buffered > st.opts.max_buffered_bytes; }
};

enum class read_outcome { message, closed, over_budget };

// A plain connection's next bytes, where the server left a request's body for its handler
// (router::leave_bodies_unread); all of them had arrived when the request was dispatched.
class socket_body final : public body_source {
  public:
    explicit socket_body(net::tcp_socket& s) : sock_(s) {}
    std::optional<std::string> read(std::size_t n, bool take) override;

  private:
    net::tcp_socket& sock_;
};

// Reads until the parser has a full message or fails. `closed` on EOF/timeout/error before any byte of a
// message, or after a transport failure; `over_budget` when a read took the server over
// max_buffered_bytes. With `unread` (a plain connection whose handlers take their bodies), a message whose
// Content-Length body has all arrived after its head comes back with the body left in the socket
// (request::unread_body), charged to the budget as if read.
// Stream: net::tcp_socket or net::tls_stream.
template <typename Stream>
asio::awaitable<read_outcome> read_request(Stream& stream, request_parser& parser, std::string& buf,
                                           clock::duration timeout, buffer_charge& charge,
                                           socket_body* unread);

// After answering a request we refused mid-upload (413/431/400), keep reading and discarding for a
// short while so the client can finish sending and read our answer; closing at once would reset the
// connection and lose the response (the "lingering close" of RFC 9112 §9.6). Stream: as read_request's.
template <typename Stream>
asio::awaitable<void> linger(Stream& stream);

}  // namespace server_detail
}  // namespace cg::http
