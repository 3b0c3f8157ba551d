#include "http/server.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cerrno>
#include <list>
#include <optional>
#include <string_view>
#include <type_traits>

#include "net/error.hpp"
#include "net/timeout.hpp"
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

namespace {

using clock = std::chrono::steady_clock;

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
    std::optional<std::string> read(std::size_t n, bool take) override {
        std::string out(n, '\0');
        std::size_t got = 0;
        while (got < n) {
            auto r = ::recv(sock_.native_handle(), out.data() + got, n - got,
                            MSG_DONTWAIT | (take ? 0 : MSG_PEEK));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return std::nullopt;
            got += static_cast<std::size_t>(r);
            if (!take && got < n) return std::nullopt;  // a peek sees at once all that is there
        }
        return out;
    }

  private:
    net::tcp_socket& sock_;
};

// Reads until the parser has a full message or fails. `closed` on EOF/timeout/error before any byte of a
// message, or after a transport failure; `over_budget` when a read took the server over
// max_buffered_bytes. With `unread` (a plain connection whose handlers take their bodies), a message whose
// Content-Length body has all arrived after its head comes back with the body left in the socket
// (request::unread_body), charged to the budget as if read.
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

// After answering a request we refused mid-upload (413/431/400), keep reading and discarding for a
// short while so the client can finish sending and read our answer; closing at once would reset the
// connection and lose the response (the "lingering close" of RFC 9112 §9.6).
void half_close(net::tcp_socket& s) {
    std::error_code ignored;
    s.shutdown(net::tcp::socket::shutdown_send, ignored);  // the client sees EOF after our answer at once
}
void half_close(net::tls_stream&) {}  // TLS: close_notify comes later; the linger still protects the answer

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
