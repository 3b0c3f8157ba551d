#include "http/client.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <atomic>
#include <deque>
#include <optional>
#include <vector>

#include "http/client_connection.hpp"
#include "http/proto/error.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"

namespace cg::http {

using clock = std::chrono::steady_clock;

namespace {

// A request waiting for the pool: woken with a connection handed over, or with a free slot.
struct waiter {
    explicit waiter(const asio::any_io_executor& ex) : timer(ex, clock::time_point::max()) {}
    net::steady_timer timer;
    std::unique_ptr<client_connection> handed;
    bool slot = false;
    bool woken = false;  // taken off the queue by whoever woke it (else: cancelled, still queued)
};

// New connections being set up at once. A pool grows only as fast as its connects finish: a burst of N
// requests does not open N connections when the ones already open come back sooner (at a fast origin they
// do — a TLS handshake costs more CPU than a request, on both sides, and every connection holds TLS
// buffers and an epoll registration), while a slow origin still gets its connections, a few at a time.
constexpr std::size_t max_connecting = 8;

// The request deadline without an `op || timer` parallel group (two spawned coroutines and their
// cancellation plumbing per request): a timer on the strand whose handler aborts whatever the attempt is
// waiting on — its place in the pool queue, or its connection's socket — so the attempt ends at once with an
// error that run_request renames to a timeout.
struct deadline {
    bool done = false;   // the attempt has ended: the handler touches nothing
    bool fired = false;  // the request timeout passed
    waiter* queued = nullptr;
    client_connection* conn = nullptr;

    void expire() {
        if (done) return;
        fired = true;
        if (queued) queued->timer.cancel();
        if (conn) conn->abort();
    }
};

// A new connection's connect, bounded by the connect timeout. On options().connect_executor the coroutine
// owns the connection until it hands it back (the request deadline cannot reach it meanwhile), so no two
// threads ever touch its socket at once.
struct connect_outcome {
    std::unique_ptr<client_connection> conn;
    bool timed_out = false;
    std::optional<cg::error> err;
};

net::awaitable<connect_outcome> connect_elsewhere(std::unique_ptr<client_connection> c, http::origin o,
                                                  std::chrono::steady_clock::duration timeout) {
    connect_outcome out;
    auto r = co_await net::with_timeout(c->connect(o, timeout), timeout);
    out.conn = std::move(c);
    if (!r)
        out.timed_out = true;
    else if (!*r)
        out.err = r->err();
    co_return out;
}

}  // namespace

// Everything below is touched only on `strand`, except the atomics.
struct client::state : std::enable_shared_from_this<client::state> {
    state(asio::any_io_executor ex, http::origin o, client_options op, logger l)
        : strand(asio::make_strand(ex)),
          origin(std::move(o)),
          opts(std::move(op)),
          log(std::move(l)),
          growth(opts.growth) {
        if (origin.tls) sessions = std::make_shared<net::tls_session_cache>();
    }

    asio::strand<asio::any_io_executor> strand;
    http::origin origin;
    client_options opts;
    logger log;
    // This origin's TLS sessions: every new connection after the first resumes instead of redoing the
    // certificate work (a pool grows to --max-in-flight connections; each full handshake costs more CPU
    // than a charge).
    std::shared_ptr<net::tls_session_cache> sessions;
    std::deque<std::unique_ptr<client_connection>> idle;  // most recently used at the back
    std::deque<waiter*> waiters;
    std::size_t connecting = 0;  // slots handed out for a connect that has not finished
    pool_growth growth;
    std::atomic<std::uint64_t> open{0}, idle_count{0}, requests{0}, connects{0}, handshakes{0}, resumed{0},
        reused{0}, held{0};

    // Room for one more connect under the pool's limits (the growth rule aside).
    bool room() const { return open < opts.max_connections && connecting < max_connecting; }

    // A connection's slot ends (closed or never opened): free it, and let a waiter connect if it may.
    void discard(std::unique_ptr<client_connection> c) {
        c.reset();
        --open;
        grow();
    }

    // Hands free slots to the oldest waiters while fewer than max_connecting connects are under way.
    void grow() {
        while (!waiters.empty() && room() && growth.try_open(open, clock::now())) {
            waiter* w = waiters.front();
            waiters.pop_front();
            ++open;
            ++connecting;
            w->woken = true;
            w->slot = true;
            w->timer.cancel();
        }
    }

    // A healthy connection comes back: straight to the oldest waiter, else to the idle list. Waiters left
    // behind may get a connect now that another answer came in at the origin's pace.
    void release(std::unique_ptr<client_connection> c) {
        if (!waiters.empty()) {
            waiter* w = waiters.front();
            waiters.pop_front();
            w->woken = true;
            w->handed = std::move(c);
            w->timer.cancel();
            grow();
            return;
        }
        c->idle_since = clock::now();
        idle.push_back(std::move(c));
        idle_count = idle.size();
    }
};

namespace {

// A slot in the pool, with or without a connection yet. Its destructor frees the slot, so a request
// abandoned at any point (timeout, error, exception) never leaks pool capacity.
class lease {
  public:
    lease() = default;
    lease(std::shared_ptr<client::state> st, std::unique_ptr<client_connection> c, bool reused)
        : st_(std::move(st)), conn_(std::move(c)), reused_(reused), connecting_(!conn_) {}
    lease(lease&& o) noexcept
        : st_(std::move(o.st_)), conn_(std::move(o.conn_)), reused_(o.reused_), connecting_(o.connecting_) {
        o.connecting_ = false;
    }
    lease& operator=(lease&&) = delete;
    ~lease() {
        if (!st_) return;
        if (connecting_) --st_->connecting;
        st_->discard(std::move(conn_));
    }
    // The connect this slot was handed out for has ended (either way): another waiter may start one.
    void connect_finished() {
        if (!connecting_) return;
        connecting_ = false;
        --st_->connecting;
        st_->grow();
    }
    bool valid() const { return st_ != nullptr; }
    bool reused() const { return reused_; }
    std::unique_ptr<client_connection>& conn() { return conn_; }
    void give_back() {
        auto st = std::move(st_);
        if (connecting_) --st->connecting;  // (connect_finished ran first; kept for safety)
        connecting_ = false;
        st->release(std::move(conn_));
    }

  private:
    std::shared_ptr<client::state> st_;
    std::unique_ptr<client_connection> conn_;
    bool reused_ = false;
    bool connecting_ = false;  // counted in state::connecting
};

// Returns a lease: a live idle connection, or an empty slot to connect on. Waits while the pool is
// full; an invalid lease means the wait was cancelled.
net::awaitable<lease> acquire(std::shared_ptr<client::state> st, deadline* dl) {
    while (!st->idle.empty()) {
        auto c = std::move(st->idle.back());
        st->idle.pop_back();
        st->idle_count = st->idle.size();
        if (c->idle_alive() && clock::now() - c->idle_since < st->opts.idle_timeout)
            co_return lease(st, std::move(c), true);
        c.reset();
        --st->open;
    }
    if (st->room()) {
        if (st->growth.try_open(st->open, clock::now())) {
            ++st->open;
            ++st->connecting;
            co_return lease(st, nullptr, false);
        }
        ++st->held;  // held by the growth rule, not by the limits: the pool could have grown and chose not to
    }
    waiter w(st->strand);
    st->waiters.push_back(&w);
    dl->queued = &w;
    co_await w.timer.async_wait();
    dl->queued = nullptr;
    // Still queued means we were cancelled rather than woken.
    if (!w.woken) {
        if (auto it = std::find(st->waiters.begin(), st->waiters.end(), &w); it != st->waiters.end())
            st->waiters.erase(it);
    }
    if (w.handed) co_return lease(st, std::move(w.handed), true);
    if (w.slot) co_return lease(st, nullptr, false);
    co_return lease();
}

// One attempt; `dl` aborts it when the request timeout passes. Sets *sent as the request leaves.
net::awaitable<client_result> attempt(std::shared_ptr<client::state> st, const request* req, bool* sent,
                                      deadline* dl) {
    client_result out;
    lease l = co_await acquire(st, dl);
    if (!l.valid() || dl->fired) {
        out.err = error(errc::pool_exhausted, "cancelled while waiting for a pooled connection");
        co_return out;
    }
    if (!l.conn()) {
        auto fresh = std::make_unique<client_connection>(st->strand, st->origin.tls ? st->opts.tls : nullptr,
                                                         st->sessions);
        connect_outcome c;
        if (st->opts.connect_executor) {
            // A strand of its own: the connect's timeout (net/timeout.hpp) needs a serial executor, and the
            // connect executor is normally the offload pool, run by several threads.
            c = co_await net::offload(
                asio::make_strand(st->opts.connect_executor),
                connect_elsewhere(std::move(fresh), st->origin, st->opts.connect_timeout));
        } else {
            dl->conn = fresh.get();
            c = co_await connect_elsewhere(std::move(fresh), st->origin, st->opts.connect_timeout);
        }
        l.conn() = std::move(c.conn);
        l.connect_finished();
        if (c.timed_out) {
            out.err = error(errc::timeout, "connect to " + st->origin.to_string() + " timed out after " +
                                               net::describe_timeout(st->opts.connect_timeout));
            co_return out;
        }
        if (c.err) {
            out.err = std::move(*c.err);
            co_return out;
        }
        dl->conn = l.conn().get();
        ++st->connects;
        if (st->origin.tls) ++st->handshakes;
        if (l.conn()->resumed()) ++st->resumed;
        // The deadline may have passed during the lookup (which no socket close interrupts).
        if (dl->fired) {
            out.err = error(errc::timeout, "deadline passed while connecting");
            co_return out;
        }
    } else {
        ++st->reused;
        dl->conn = l.conn().get();
    }
    out.reused_connection = l.reused();
    auto t0 = clock::now();
    auto r = co_await l.conn()->exchange(*req, sent, st->opts.limits);
    if (!r) {
        out.err = r.err();
        co_return out;
    }
    auto t1 = clock::now();
    st->growth.exchanged(t1 - t0, t1);
    out.resp = std::move(*r);
    if (l.conn()->reusable()) l.give_back();
    co_return out;
}

net::awaitable<client_result> run_request(std::shared_ptr<client::state> st, request req,
                                          clock::time_point until) {
    ++st->requests;
    if (!req.headers.has("Host")) req.headers.add("Host", st->origin.host_header());
    bool sent = false;
    auto dl = std::make_shared<deadline>();
    net::steady_timer timer(st->strand, until);
    timer.async_wait([dl](std::error_code ec) {
        if (!ec) dl->expire();
    });
    auto r = co_await attempt(st, &req, &sent, dl.get());
    dl->done = true;  // on the strand, before anything else can run: a late handler is a no-op
    timer.cancel();
    // A response that completed as the deadline passed is still that response.
    if (!dl->fired || r.ok()) {
        r.request_sent = r.err ? sent : true;
        co_return r;
    }
    client_result out;
    out.request_sent = sent;
    out.err = error(errc::timeout, std::string(sent ? "no response" : "request not sent") + " from " +
                                       st->origin.to_string() + " within " +
                                       net::describe_timeout(st->opts.request_timeout));
    co_return out;
}

}  // namespace

result<std::unique_ptr<client>> client::create(asio::any_io_executor ex, std::string_view base_url,
                                               client_options opts, logger log) {
    auto o = parse_origin(base_url);
    if (!o) return o.err();
    if (o->tls && !opts.tls)
        return error(core_errc::invalid_argument, "https origin needs a TLS client context");
    if (opts.max_connections == 0)
        return error(core_errc::invalid_argument, "max_connections must be at least 1");
    return std::make_unique<client>(std::move(ex), std::move(*o), std::move(opts), std::move(log));
}

client::client(asio::any_io_executor ex, http::origin o, client_options opts, logger log)
    : st_(std::make_shared<state>(std::move(ex), std::move(o), std::move(opts), std::move(log))) {}

client::~client() {
    // Idle connections are owned by the state; drop them on the strand so no handler races the close.
    asio::post(st_->strand, [st = st_] {
        st->idle.clear();
        st->idle_count = 0;
    });
}

net::awaitable<client_result> client::request(http::request req) {
    return request(std::move(req), clock::now() + st_->opts.request_timeout);
}

net::awaitable<client_result> client::request(http::request req, clock::time_point deadline) {
    // Already on the strand (the Stripe layer's retry loop runs there): no hop through co_spawn's post.
    if (st_->strand.running_in_this_thread()) co_return co_await run_request(st_, std::move(req), deadline);
    co_return co_await net::offload(st_->strand, run_request(st_, std::move(req), deadline));
}

const http::origin& client::target() const noexcept {
    return st_->origin;
}
const client_options& client::options() const noexcept {
    return st_->opts;
}
asio::strand<asio::any_io_executor> client::get_executor() const noexcept {
    return st_->strand;
}

client_stats client::stats() const {
    client_stats s;
    s.requests = st_->requests;
    s.connects = st_->connects;
    s.handshakes = st_->handshakes;
    s.resumed = st_->resumed;
    s.reused = st_->reused;
    s.open = st_->open;
    s.idle = st_->idle_count;
    s.held = st_->held;
    return s;
}

}  // namespace cg::http
