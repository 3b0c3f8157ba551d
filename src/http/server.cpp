// http::server: the accept loop, each connection's life (plain or TLS, the requests it serves, its shedding
// when connections or buffered bytes run out) and the server's API. Reading a request is server_read.cpp.
#include "http/server.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cerrno>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "http/server_state.hpp"
#include "net/error.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"

namespace cg::http {
namespace {

using namespace server_detail;

using conn_it = std::list<server::state::conn>::iterator;

void shed(server::state& st, server::state::conn& c) {
    c.shed = true;
    ++st.shed_pending;
    ++st.shed_total;
    server::state::count(st.shed_make_room);
    std::error_code ignored;
    c.sock->close(ignored);  // its pending read/handshake completes with operation_aborted
}

// Closes the oldest connection that has not completed a request; failing that, the oldest kept-alive one
// waiting between requests (its client reconnects, as HTTP/1.1 clients do when an idle connection
// closes), so connections that made one cheap request each cannot hold every slot either. A request being
// handled is never cut. Returns false when there is nothing to shed.
bool shed_oldest_idle(server::state& st) {
    for (auto& c : st.conns)
        if (!c.served && !c.shed) {
            shed(st, c);
            return true;
        }
    for (auto& c : st.conns)
        if (c.between && !c.shed) {
            shed(st, c);
            return true;
        }
    return false;
}

template <typename Stream>
asio::awaitable<void> serve(std::shared_ptr<server::state> st, Stream& stream, conn_it self,
                            clock::duration first_timeout) {
    request_parser parser(st->opts.limits);
    std::string buf, out;
    buffer_charge charge(*st);
    std::optional<socket_body> unread;
    if constexpr (std::is_same_v<Stream, net::tcp_socket>)
        if (st->routes.bodies_unread()) unread.emplace(stream);
    while (!st->stopped) {
        auto timeout = self->served ? st->opts.read_timeout : first_timeout;
        self->between = self->served;
        auto got = co_await read_request(stream, parser, buf, timeout, charge, unread ? &*unread : nullptr);
        self->between = false;
        if (got == read_outcome::closed) co_return;
        if (got == read_outcome::over_budget) {
            // Shed: what this connection read goes back now (the body's memory too, not only its charge:
            // the linger below holds the connection for a while), and the client is told to come back later.
            ++st->over_budget_total;
            server::state::count(st->shed_over_budget);
            std::string().swap(parser.message().body);
            parser.reset();
            std::string().swap(buf);
            charge.settle(0);
            auto resp = make_response(503, "server busy: too many bytes in flight\n");
            resp.headers.set("Connection", "close");
            resp.headers.set("Retry-After", "5");
            resp.headers.add("Server", st->opts.server_name);
            out.clear();
            serialize(resp, out, false);
            auto [ec, n] = co_await asio::async_write(stream, asio::buffer(out), net::nothrow);
            if (!ec) co_await linger(stream);
            co_return;
        }
        // The message is parsed out of the read buffer; when nothing of a next request is left in it, its
        // memory goes back now rather than being held while the handler runs (a proxied call may take
        // seconds, across thousands of connections).
        if (buf.empty()) std::string().swap(buf);
        self->served = true;
        response resp;
        bool head = false;
        if (parser.state() == parse_state::failed) {
            resp = make_response(status_for(parser.error()), parser.error_detail() + "\n");
            resp.headers.set("Connection", "close");
        } else {
            request& req = parser.message();
            head = req.method == "HEAD";
            try {
                resp = co_await st->routes.dispatch(req);
            } catch (const std::exception& e) {
                st->log.error("http handler failed", {{"path", req.path()}, {"error", e.what()}});
                resp = make_response(500, "internal error\n");
            }
            if (st->stopped || resp.abort_connection) co_return;
            // What the handler left of its body in the socket goes: the next request starts after it.
            if (req.unread_body > 0) {
                if (!req.take_body()) co_return;
                std::string().swap(req.body);
            }
            if (!req.keep_alive()) resp.headers.set("Connection", "close");
        }
        if (!resp.headers.has("Server")) resp.headers.add("Server", st->opts.server_name);
        out.clear();
        serialize(resp, out, head);
        auto [ec, n] = co_await asio::async_write(stream, asio::buffer(out), net::nothrow);
        if (ec) co_return;
        if (parser.state() == parse_state::failed) {
            co_await linger(stream);
            co_return;
        }
        if (!resp.keep_alive()) co_return;
        // The body's memory goes back with its charge: a reset keeps a string's capacity, and a kept-alive
        // connection would otherwise hold its largest body uncounted until it closes.
        std::string().swap(parser.message().body);
        parser.reset();
        charge.settle(buf.size());
    }
}

// A TLS connection: handshake, requests, close_notify. A coroutine of its own, so a plain connection's frame
// has no room for the TLS stream.
asio::awaitable<void> serve_tls(std::shared_ptr<server::state> st, net::tcp_socket& sock, conn_it self,
                                clock::time_point first_deadline) {
    net::tls_stream tls(std::move(sock), *st->opts.tls);
    self->sock = &tls.next_layer();
    if (self->shed) co_return;
    auto hs = co_await net::with_timeout(tls.async_handshake(asio::ssl::stream_base::server),
                                         std::min(st->opts.handshake_timeout, st->opts.read_timeout));
    if (!hs || std::get<0>(*hs) || self->shed) co_return;
    co_await serve(st, tls, self, first_deadline - clock::now());
    // Best-effort close_notify, bounded so a silent peer cannot hold the coroutine.
    (void)co_await net::with_timeout(tls.async_shutdown(net::nothrow), std::chrono::seconds(1));
}

asio::awaitable<void> run_connection(std::shared_ptr<server::state> st, net::tcp_socket sock) {
    const auto accepted = clock::now();
    auto self = st->conns.insert(st->conns.end(), server::state::conn{&sock});
    struct unregister {
        server::state* st;
        conn_it it;
        ~unregister() {
            if (it->shed) --st->shed_pending;
            st->conns.erase(it);
        }
    } guard{st.get(), self};
    // The first request's deadline counts from the accept, so a slow handshake leaves less for the head.
    auto first_deadline = accepted + std::min(st->opts.first_request_timeout, st->opts.read_timeout);

    if (!st->opts.tls) {
        std::error_code ignored;
        sock.non_blocking(true, ignored);  // read_more reads what a readiness wait found there
        co_await serve(st, sock, self, first_deadline - clock::now());
        sock.shutdown(net::tcp::socket::shutdown_both, ignored);
        co_return;
    }
    co_await serve_tls(st, sock, self, first_deadline);
}

asio::awaitable<void> accept_loop(std::shared_ptr<server::state> st) {
    while (!st->stopped) {
        auto [ec, sock] = co_await st->acceptor.async_accept();
        if (ec) {
            if (st->stopped || ec == asio::error::operation_aborted) co_return;
            // Out of descriptors: one idle connection's descriptor is the next client's.
            bool out_of_fds = ec == asio::error::no_descriptors || ec.value() == ENFILE;
            if (out_of_fds && shed_oldest_idle(*st)) {
                co_await asio::post(st->ex, asio::use_awaitable);  // let the shed connection close
                continue;
            }
            st->log.warn("accept failed", {{"error", ec.message()}});
            // EMFILE and friends with nothing to shed: back off briefly instead of spinning.
            co_await net::sleep_for(std::chrono::milliseconds(50));
            continue;
        }
        if (st->conns.size() - st->shed_pending >= st->opts.max_connections && !shed_oldest_idle(*st)) {
            ++st->refused_total;
            server::state::count(st->shed_refused);
            std::error_code ignored;
            sock.close(ignored);
            continue;
        }
        std::error_code ignored;
        sock.set_option(net::tcp::no_delay(true), ignored);
        asio::co_spawn(st->ex, run_connection(st, std::move(sock)), [log = st->log](std::exception_ptr e) {
            if (!e) return;
            log.error("http connection failed", {{"error", describe_exception(e)}});
        });
    }
}

}  // namespace

server::server(asio::any_io_executor ex, router routes, server_options opts, logger log)
    : st_(std::make_shared<state>(ex, std::move(routes), std::move(opts), std::move(log))) {}

server::~server() {
    if (st_ && !st_->stopped) stop();
}

result<net::tcp::endpoint> server::listen(const net::host_port& where) {
    std::error_code ec;
    auto addr = asio::ip::make_address(where.host, ec);
    if (ec) return cg::error(net::errc::bad_address, "listen address must be an IP literal: " + where.host);
    net::tcp::endpoint ep(addr, where.port);
    auto& a = st_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(net::tcp::acceptor::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
        std::error_code ignored;
        a.close(ignored);
        return error(ec, "listen on " + where.to_string());
    }
    return a.local_endpoint();
}

void server::start() {
    asio::co_spawn(st_->ex, accept_loop(st_), [log = st_->log](std::exception_ptr e) {
        if (!e) return;
        log.error("http accept loop failed", {{"error", describe_exception(e)}});
    });
}

void server::stop() {
    st_->stopped = true;
    std::error_code ignored;
    st_->acceptor.close(ignored);
    for (auto& c : st_->conns) c.sock->close(ignored);
}

net::tcp::endpoint server::local_endpoint() const {
    std::error_code ec;
    return st_->acceptor.local_endpoint(ec);
}

std::size_t server::open_connections() const {
    return st_->conns.size() - st_->shed_pending;
}

std::uint64_t server::shed_connections() const {
    return st_->shed_total;
}

std::uint64_t server::refused_connections() const {
    return st_->refused_total;
}

std::size_t server::buffered_bytes() const {
    return st_->buffered;
}

std::uint64_t server::over_budget_requests() const {
    return st_->over_budget_total;
}

}  // namespace cg::http
