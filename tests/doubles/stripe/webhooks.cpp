// fake-stripe's webhook sender (tests/doubles/stripe/webhooks.hpp): the queue of events, each delivery's
// attempts and retries, duplicates, holds and reordering. The signature header and the JSON's layout are
// webhook_wire.cpp.
#include "tests/doubles/stripe/webhooks.hpp"

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/write.hpp>
#include <deque>
#include <random>
#include <set>

#include "http/origin.hpp"
#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "stripe/webhook_signature.hpp"

namespace cg::fake {
namespace {

using clock = std::chrono::steady_clock;

struct item {
    webhook_event_out ev;
    bool duplicate = false;
    bool hold = false;
    bool reordered = false;
    clock::time_point due;
    std::uint64_t seq = 0;
};

struct attempt_result {
    int status = 0;
    std::string error;
};

}  // namespace

struct webhook_sender::state : std::enable_shared_from_this<state> {
    asio::any_io_executor ex;
    logger log;
    std::function<std::int64_t()> unix_now;
    webhook_endpoint ep;
    webhook_faults faults;
    std::mt19937_64 rng;
    std::deque<item> queue;
    std::vector<item> held;
    std::vector<delivery_rec> deliveries;
    std::set<std::string> acked_ids;
    webhook_stats st;
    std::uint64_t gen = 0;  // reset() bumps it: coroutines of an older generation record nothing
    std::uint64_t seq = 0;
    bool worker_running = false;
    std::vector<std::shared_ptr<net::steady_timer>> waiters;
    std::shared_ptr<asio::ssl::context> tls;
    std::string tls_error;

    void notify() {
        for (auto& w : waiters) w->cancel();
        waiters.clear();
    }

    bool roll(int& count, int pct) {
        if (count > 0) {
            --count;
            return true;
        }
        return pct > 0 && std::uniform_int_distribution<int>(0, 99)(rng) < pct;
    }

    void finish_copy() {
        if (st.outstanding > 0) --st.outstanding;
    }

    asio::awaitable<attempt_result> post_once(const item& it, std::string signature);
    asio::awaitable<bool> attempt(const item& it, int n, std::uint64_t g);
    asio::awaitable<void> retry_from(item it, int n, std::uint64_t g);
    asio::awaitable<void> deliver_released(item it, std::uint64_t g);
    asio::awaitable<void> hold_timeout(std::uint64_t seq, std::uint64_t g);
    asio::awaitable<void> worker(std::uint64_t g);
    void release_after(const item& delivered);
    void spawn(asio::awaitable<void> a) { asio::co_spawn(ex, std::move(a), asio::detached); }
};

asio::awaitable<attempt_result> webhook_sender::state::post_once(const item& it, std::string signature) {
    auto self = shared_from_this();
    std::string url = ep.url;
    auto scheme_end = url.find("://");
    auto path_at = scheme_end == std::string::npos ? std::string::npos : url.find('/', scheme_end + 3);
    std::string path = path_at == std::string::npos ? "/" : url.substr(path_at);
    auto o = http::parse_origin(url.substr(0, path_at));
    if (!o) co_return attempt_result{0, "bad url: " + o.err().describe()};
    if (o->tls && !tls) {
        auto ctx = net::make_tls_client_context({ep.ca_file});
        if (!ctx) co_return attempt_result{0, "tls: " + ctx.err().describe()};
        tls = *ctx;
    }
    http::request req;
    req.method = "POST";
    req.target = path;
    req.headers.add("Host", o->host_header());
    req.headers.add("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)");
    req.headers.add("Accept", "*/*; q=0.5, application/xml");
    req.headers.add("Cache-Control", "no-cache");
    req.headers.add("Content-Type", "application/json; charset=utf-8");
    req.headers.add("Stripe-Signature", std::move(signature));
    req.headers.add("Connection", "close");
    req.body = it.ev.body;
    std::string wire;
    http::serialize(req, wire);

    auto exchange = [](auto& stream, std::string wire) -> asio::awaitable<attempt_result> {
        auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(wire));
        (void)wn;
        if (wec) co_return attempt_result{0, "write: " + wec.message()};
        http::response_parser p;
        char buf[4096];
        for (;;) {
            auto [rec, n] = co_await stream.async_read_some(asio::buffer(buf));
            if (rec) {
                p.feed_eof();
                if (p.state() == http::parse_state::done) co_return attempt_result{p.message().status, {}};
                co_return attempt_result{0, "read: " + rec.message()};
            }
            p.feed(std::string_view(buf, n));
            if (p.state() == http::parse_state::done) co_return attempt_result{p.message().status, {}};
            if (p.state() == http::parse_state::failed)
                co_return attempt_result{0, "bad response: " + p.error_detail()};
        }
    };

    auto op = [](std::shared_ptr<state> self, http::origin o, std::string wire,
                 decltype(exchange) exchange) -> asio::awaitable<attempt_result> {
        net::tcp_resolver resolver(self->ex);
        auto [rec, results] = co_await resolver.async_resolve(o.host, std::to_string(o.port));
        if (rec) co_return attempt_result{0, "resolve: " + rec.message()};
        net::tcp_socket sock(self->ex);
        auto [cec, where] = co_await asio::async_connect(sock, results);
        (void)where;
        if (cec) co_return attempt_result{0, "connect: " + cec.message()};
        if (!o.tls) co_return co_await exchange(sock, std::move(wire));
        net::tls_stream s(std::move(sock), *self->tls);
        if (auto r = net::prepare_tls_client(s, o.host); !r) co_return attempt_result{0, r.err().describe()};
        auto [hec] = co_await s.async_handshake(asio::ssl::stream_base::client);
        if (hec) co_return attempt_result{0, "handshake: " + hec.message()};
        co_return co_await exchange(s, std::move(wire));
    };
    auto r = co_await net::with_timeout(op(self, *o, std::move(wire), exchange),
                                        std::chrono::milliseconds(ep.timeout_ms));
    if (!r) co_return attempt_result{0, "timeout after " + std::to_string(ep.timeout_ms) + " ms"};
    co_return *r;
}

// One attempt, recorded. True when the copy is done with (acknowledged, or out of attempts).
asio::awaitable<bool> webhook_sender::state::attempt(const item& it, int n, std::uint64_t g) {
    auto self = shared_from_this();
    auto t = unix_now() - faults.sign_skew_s;
    auto sig = stripe_signature_header(ep.secrets, t, it.ev.body);
    ++st.attempts;
    auto r = co_await post_once(it, sig);
    if (g != gen) co_return true;
    bool ok = r.status >= 200 && r.status < 300;
    deliveries.push_back(
        {it.ev.id, it.ev.type, n, r.status, r.error, it.duplicate, it.reordered, sig, it.ev.body});
    if (ok) {
        ++st.acked;
        if (acked_ids.insert(it.ev.id).second) ++st.acked_events;
    } else {
        ++st.failed;
        log.debug("fake-stripe webhook " + it.ev.id + " attempt " + std::to_string(n) + ": " +
                  (r.status ? "HTTP " + std::to_string(r.status) : r.error));
    }
    bool done = ok;
    if (!ok && n >= ep.max_attempts) {
        ++st.given_up;
        done = true;
    }
    if (done) finish_copy();
    notify();
    co_return done;
}

asio::awaitable<void> webhook_sender::state::retry_from(item it, int n, std::uint64_t g) {
    auto self = shared_from_this();
    for (;; ++n) {
        double ms = static_cast<double>(ep.retry_base_ms) * static_cast<double>(1ull << std::min(n - 2, 20));
        ms = std::min(ms, static_cast<double>(ep.retry_max_ms));
        co_await net::sleep_for(std::chrono::milliseconds(static_cast<std::int64_t>(ms)));
        if (g != gen) co_return;
        if (co_await attempt(it, n, g)) co_return;
        if (g != gen) co_return;
    }
}

void webhook_sender::state::release_after(const item& delivered) {
    for (auto i = held.begin(); i != held.end();) {
        if (i->ev.group == delivered.ev.group && i->seq < delivered.seq) {
            item h = std::move(*i);
            i = held.erase(i);
            spawn(deliver_released(std::move(h), gen));
        } else {
            ++i;
        }
    }
}

asio::awaitable<void> webhook_sender::state::deliver_released(item it, std::uint64_t g) {
    auto self = shared_from_this();
    bool done = co_await attempt(it, 1, g);
    if (g != gen) co_return;
    release_after(it);
    if (!done) co_await retry_from(std::move(it), 2, g);
}

asio::awaitable<void> webhook_sender::state::hold_timeout(std::uint64_t s, std::uint64_t g) {
    auto self = shared_from_this();
    co_await net::sleep_for(std::chrono::milliseconds(faults.reorder_hold_ms));
    if (g != gen) co_return;
    for (auto i = held.begin(); i != held.end(); ++i)
        if (i->seq == s) {
            item h = std::move(*i);
            held.erase(i);
            co_await deliver_released(std::move(h), g);
            co_return;
        }
}

asio::awaitable<void> webhook_sender::state::worker(std::uint64_t g) {
    auto self = shared_from_this();
    while (g == gen && !queue.empty()) {
        item it = std::move(queue.front());
        queue.pop_front();
        if (auto now = clock::now(); it.due > now) co_await net::sleep_for(it.due - now);
        if (g != gen) break;
        if (it.hold) {
            it.reordered = true;
            ++st.reordered;
            auto s = it.seq;
            held.push_back(std::move(it));
            spawn(hold_timeout(s, g));
            continue;
        }
        bool done = co_await attempt(it, 1, g);
        if (g != gen) break;
        release_after(it);
        if (!done) spawn(retry_from(std::move(it), 2, g));
    }
    if (g == gen) worker_running = false;
}

webhook_sender::webhook_sender(asio::any_io_executor ex, logger log, std::function<std::int64_t()> unix_now,
                               std::uint64_t seed)
    : st_(std::make_shared<state>()) {
    st_->ex = ex;
    st_->log = std::move(log);
    st_->unix_now = std::move(unix_now);
    st_->rng.seed(seed);
}

webhook_sender::~webhook_sender() {
    ++st_->gen;
    st_->queue.clear();
    st_->held.clear();
    st_->notify();
}

void webhook_sender::configure(webhook_endpoint e) {
    if (e.ca_file != st_->ep.ca_file) st_->tls.reset();
    st_->ep = std::move(e);
}

const webhook_endpoint& webhook_sender::endpoint() const noexcept {
    return st_->ep;
}

webhook_faults& webhook_sender::faults() noexcept {
    return st_->faults;
}

bool webhook_sender::enabled(const std::string& type) const {
    const auto& ev = st_->ep.enabled_events;
    if (st_->ep.url.empty()) return false;
    if (ev.empty()) return true;
    for (const auto& e : ev)
        if (e == "*" || e == type) return true;
    return false;
}

void webhook_sender::send(webhook_event_out ev) {
    if (!enabled(ev.type)) return;
    auto& s = *st_;
    ++s.st.events;
    item it;
    it.ev = std::move(ev);
    it.due = clock::now() + std::chrono::milliseconds(s.faults.delay_ms);
    it.seq = ++s.seq;
    it.hold = s.roll(s.faults.reorder, s.faults.reorder_pct);
    bool dup = s.roll(s.faults.duplicate, s.faults.duplicate_pct);
    s.queue.push_back(it);
    ++s.st.outstanding;
    if (dup) {
        item copy = it;
        copy.duplicate = true;
        copy.hold = false;
        copy.seq = ++s.seq;
        s.queue.push_back(std::move(copy));
        ++s.st.outstanding;
        ++s.st.duplicates;
    }
    if (!s.worker_running) {
        s.worker_running = true;
        s.spawn(s.worker(s.gen));
    }
    s.notify();
}

const std::vector<delivery_rec>& webhook_sender::deliveries() const noexcept {
    return st_->deliveries;
}

webhook_stats webhook_sender::stats() const {
    return st_->st;
}

bool webhook_sender::idle() const {
    return st_->st.outstanding == 0;
}

asio::awaitable<bool> webhook_sender::wait(std::function<bool()> pred, std::chrono::milliseconds timeout) {
    auto st = st_;
    auto deadline = clock::now() + timeout;
    while (!pred()) {
        if (clock::now() >= deadline) co_return false;
        auto t = std::make_shared<net::steady_timer>(st->ex, deadline);
        st->waiters.push_back(t);
        co_await t->async_wait();
    }
    co_return true;
}

void webhook_sender::notify() {
    st_->notify();
}

void webhook_sender::reset() {
    auto& s = *st_;
    ++s.gen;
    s.queue.clear();
    s.held.clear();
    s.deliveries.clear();
    s.acked_ids.clear();
    s.st = {};
    s.faults = {};
    s.worker_running = false;
    s.notify();
}

}  // namespace cg::fake
