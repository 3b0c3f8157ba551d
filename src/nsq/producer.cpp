#include "nsq/producer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/write.hpp>
#include <deque>
#include <random>
#include <span>

#include "net/address.hpp"
#include "net/resolve.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsq/handshake.hpp"
#include "nsq/policy.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/proto/error_frame.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/task.hpp"
#include "nsq/transport.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

namespace {
constexpr auto no_deadline = sclock::time_point::max();

// nsqd's fatal checks on what a publish carries (protocol_v2.go PUB, DPUB, MPUB and readMPUB), made before
// sending: nsqd closes the connection after such an error, failing every publish pipelined with the bad
// one (with the wrong error), so the bad call fails alone here instead. Limits from the producer's
// configuration: nsqd's IDENTIFY reply does not carry them.
error refuse(std::string what) {
    return error(errc::invalid_publish, std::move(what));
}

error check_body(std::string_view body, const producer_config& c, const std::string& what) {
    if (body.empty()) return refuse(what + ": empty message body (nsqd refuses it: E_BAD_MESSAGE)");
    if (static_cast<std::int64_t>(body.size()) > c.max_msg_size)
        return refuse(what + ": message body of " + std::to_string(body.size()) + " bytes is over nsqd's " +
                      "max-msg-size " + std::to_string(c.max_msg_size));
    return {};
}

error check_mpub(std::span<const std::string> bodies, const producer_config& c) {
    std::int64_t total = 4;  // [num] then [size][body] each
    for (std::size_t i = 0; i < bodies.size(); ++i) {
        if (auto e = check_body(bodies[i], c, "MPUB message " + std::to_string(i))) return e;
        total += 4 + static_cast<std::int64_t>(bodies[i].size());
    }
    if (total > c.max_body_size)
        return refuse("MPUB body of " + std::to_string(total) + " bytes is over nsqd's max-body-size " +
                      std::to_string(c.max_body_size) + " (split the batch)");
    return {};
}

struct waiter {
    explicit waiter(asio::any_io_executor ex) : wake(ex, no_deadline) {}
    net::steady_timer wake;
    bool done = false;
    error err;
    std::uint64_t count = 0;
};
}  // namespace

struct producer::state {
    state(asio::any_io_executor e, std::string a, producer_config c, logger l)
        : ex(e),
          address(std::move(a)),
          cfg(std::move(c)),
          log(l.with({{"nsqd", address}})),
          decoder(cfg.max_frame_size),
          writer_wake(e, no_deadline),
          connect_wake(e, no_deadline),
          idle_wake(e, no_deadline) {}

    asio::any_io_executor ex;
    std::string address;
    producer_config cfg;
    logger log;
    // One transport per connection; the loops of a connection hold theirs and its generation, so a
    // reconnect never hands a new connection to loops still unwinding from the old one.
    std::shared_ptr<transport> io;
    std::uint64_t generation = 0;
    std::shared_ptr<asio::ssl::context> tls;
    bool tls_ready = false;
    proto::frame_decoder decoder;
    std::string out, sending;
    std::deque<std::shared_ptr<waiter>> pending;
    net::steady_timer writer_wake, connect_wake, idle_wake;
    bool connected = false, connecting = false, closed = false, writer_waiting = false, done = false;
    unsigned failures = 0;
    sclock::time_point next_attempt{};
    std::uint64_t published = 0;
    std::mt19937_64 rng{std::random_device{}()};

    void notify_writer() {
        if (writer_waiting) writer_wake.cancel();
    }

    void complete_front(error e) {
        auto w = pending.front();
        pending.pop_front();
        w->done = true;
        w->err = std::move(e);
        if (!w->err) published += w->count;
        w->wake.cancel();
        if (pending.empty()) idle_wake.cancel();
    }

    // The connection ended: every pending call fails (its message may or may not have been published).
    void fail_all(const error& e) {
        if (!connected) return;
        connected = false;
        done = true;
        if (io) io->close();
        writer_wake.cancel();
        while (!pending.empty()) complete_front(e);
        ++failures;
        auto delay = reconnect_delay(failures, cfg.reconnect_backoff_min, cfg.reconnect_backoff_max,
                                     std::uniform_real_distribution<double>(0, 1)(rng));
        next_attempt = sclock::now() + delay;
        // A close we asked for is not news; a connection that broke under us is.
        if (closed) return;
        log.warn("nsqd producer connection lost", {{"error", e.describe()}});
    }
};

namespace {

asio::awaitable<void> read_loop(std::shared_ptr<producer::state> st, std::shared_ptr<transport> io,
                                std::uint64_t gen) {
    for (;;) {
        auto area = st->decoder.prepare(16 * 1024);
        auto [ec, n] = co_await io->read_some(asio::buffer(area.data(), area.size()));
        if (st->done || st->generation != gen) co_return;
        if (ec) {
            st->fail_all(
                error(ec == asio::error::eof ? make_error_code(errc::connection_closed) : ec, "read"));
            co_return;
        }
        st->decoder.commit(n);
        proto::frame f;
        proto::decode_status s;
        while ((s = st->decoder.next(f)) == proto::decode_status::frame) {
            if (f.type == proto::frame_type::response && f.data == "_heartbeat_") {
                proto::append_nop(st->out);
                st->notify_writer();
            } else if (st->pending.empty()) {
                st->fail_all(error(errc::bad_response, "answer without a command: " + std::string(f.data)));
                co_return;
            } else if (f.type == proto::frame_type::response) {
                st->complete_front({});
            } else if (f.type == proto::frame_type::error) {
                auto e = proto::classify_error(f.data);
                st->complete_front(error(errc::server_error, std::string(f.data)));
                if (e.fatal) {
                    st->fail_all(error(errc::server_error, std::string(f.data)));
                    co_return;
                }
            } else {
                st->fail_all(error(errc::bad_response, "message frame on a producer connection"));
                co_return;
            }
        }
        if (s == proto::decode_status::error) {
            st->fail_all(st->decoder.last_error());
            co_return;
        }
    }
}

asio::awaitable<void> write_loop(std::shared_ptr<producer::state> st, std::shared_ptr<transport> io,
                                 std::uint64_t gen) {
    for (;;) {
        while (st->out.empty()) {
            if (st->done || st->generation != gen) co_return;
            st->writer_waiting = true;
            co_await st->writer_wake.async_wait();
            st->writer_waiting = false;
        }
        if (st->done || st->generation != gen) co_return;
        std::swap(st->out, st->sending);
        auto [ec, n] = co_await io->write(st->sending);
        st->sending.clear();
        if (st->done || st->generation != gen) co_return;
        if (ec) {
            st->fail_all(error(ec, "write"));
            co_return;
        }
    }
}

asio::awaitable<error> connect(std::shared_ptr<producer::state> st) {
    auto hp = net::parse_host_port(st->address);
    if (!hp) co_return hp.err();
    if (!st->tls_ready) {  // reads the CA/cert files once, on the first connect
        auto ctx = make_nsq_tls_context(st->cfg.security);
        if (!ctx) co_return ctx.err();
        st->tls = *ctx;
        st->tls_ready = true;
    }
    auto eps = co_await resolve_all(*hp, st->cfg.connect_timeout, st->cfg.resolver);
    if (!eps) co_return eps.err();
    ++st->generation;
    st->io = std::make_shared<transport>(st->ex);
    st->decoder = proto::frame_decoder(st->cfg.max_frame_size);
    st->out.clear();
    auto deadline = sclock::now() + st->cfg.connect_timeout;
    if (auto e = co_await st->io->connect(std::move(*eps), st->cfg.connect_timeout, st->address)) co_return e;
    st->io->set_no_delay();
    handshake_options o;
    o.identify.client_id = st->cfg.client_id.empty() ? short_hostname() : st->cfg.client_id;
    o.identify.hostname = st->cfg.hostname.empty() ? local_hostname() : st->cfg.hostname;
    o.identify.user_agent = st->cfg.user_agent;
    o.identify.heartbeat_interval_ms = st->cfg.heartbeat_interval.count();
    o.security = &st->cfg.security;
    o.tls = st->tls.get();
    o.tls_host = st->cfg.security.tls_server_name.empty() ? hp->host : st->cfg.security.tls_server_name;
    o.what = st->address;
    auto neg = co_await handshake(*st->io, st->decoder, o, deadline, st->log);
    if (!neg) {
        st->io->close();
        co_return neg.err();
    }
    co_return error{};
}

asio::awaitable<void> serve(std::shared_ptr<producer::state> st) {
    auto io = st->io;
    auto gen = st->generation;
    co_await net::race(read_loop(st, io, gen), write_loop(st, io, gen));
}

}  // namespace

producer::producer(asio::any_io_executor ex, std::string address, producer_config cfg, logger log)
    : st_(std::make_shared<state>(ex, std::move(address), std::move(cfg), std::move(log))) {}

producer::~producer() {
    st_->closed = true;
    st_->fail_all(error(errc::shutting_down, "producer destroyed"));
    st_->connect_wake.cancel();
}

asio::awaitable<result<void>> producer::send(std::string command, std::uint64_t count) {
    auto st = st_;
    if (st->closed) co_return error(errc::shutting_down, "producer closed");
    while (!st->connected) {
        if (st->connecting) {
            co_await st->connect_wake.async_wait();
            if (st->closed) co_return error(errc::shutting_down, "producer closed");
            if (!st->connected && !st->connecting)
                co_return error(errc::connection_closed, "connect to " + st->address + " failed");
            continue;
        }
        st->connecting = true;
        if (auto wait = st->next_attempt - sclock::now(); wait > sclock::duration::zero())
            co_await net::sleep_for(wait);
        auto e = co_await connect(st);
        st->connecting = false;
        if (!e) {
            st->connected = true;
            st->done = false;
            st->failures = 0;
            asio::co_spawn(st->ex, serve(st), [st](std::exception_ptr ep) {
                // The loops report I/O errors through fail_all; an exception here is a bug. Fail the
                // pending calls (they see an error, never a silent hang) and say what happened.
                if (!ep) return;
                st->log.error("producer connection task failed", {{"error", describe_exception(ep)}});
                st->fail_all(error(errc::connection_closed, "producer connection task failed"));
            });
        } else {
            ++st->failures;
            st->next_attempt = sclock::now() + reconnect_delay(st->failures, st->cfg.reconnect_backoff_min,
                                                               st->cfg.reconnect_backoff_max, 0.5);
        }
        st->connect_wake.cancel();
        if (e) co_return e;
    }
    auto w = std::make_shared<waiter>(st->ex);
    w->count = count;
    st->out += command;
    st->pending.push_back(w);
    st->notify_writer();
    co_await net::with_timeout(w->wake.async_wait(), st->cfg.publish_timeout);
    if (!w->done) {
        // Answers would no longer line up with commands: start over on a new connection.
        st->fail_all(error(errc::timeout, "no answer from nsqd within the publish timeout"));
    }
    if (w->err) co_return w->err;
    co_return result<void>{};
}

asio::awaitable<result<void>> producer::publish(std::string topic, std::string body) {
    if (!proto::valid_topic_name(topic)) co_return error(errc::bad_name, "topic '" + topic + "'");
    if (auto e = check_body(body, st_->cfg, "PUB")) co_return e;
    std::string cmd;
    proto::append_pub(cmd, topic, body);
    co_return co_await send(std::move(cmd), 1);
}

asio::awaitable<result<void>> producer::multi_publish(std::string topic, std::vector<std::string> bodies) {
    if (!proto::valid_topic_name(topic)) co_return error(errc::bad_name, "topic '" + topic + "'");
    if (bodies.empty()) co_return result<void>{};
    if (auto e = check_mpub(bodies, st_->cfg)) co_return e;
    std::string cmd;
    proto::append_mpub(cmd, topic, std::span<const std::string>(bodies));
    co_return co_await send(std::move(cmd), bodies.size());
}

asio::awaitable<result<void>> producer::deferred_publish(std::string topic, milliseconds delay,
                                                         std::string body) {
    if (!proto::valid_topic_name(topic)) co_return error(errc::bad_name, "topic '" + topic + "'");
    if (delay > st_->cfg.max_req_timeout)
        co_return refuse("DPUB delay of " + std::to_string(delay.count()) + " ms is over nsqd's " +
                         "max-req-timeout " + std::to_string(st_->cfg.max_req_timeout.count()) + " ms");
    if (auto e = check_body(body, st_->cfg, "DPUB")) co_return e;
    std::string cmd;
    proto::append_dpub(cmd, topic, static_cast<std::uint64_t>(std::max<long long>(0, delay.count())), body);
    co_return co_await send(std::move(cmd), 1);
}

asio::awaitable<void> producer::close() {
    auto st = st_;
    while (!st->pending.empty()) co_await st->idle_wake.async_wait();
    st->closed = true;
    st->fail_all(error(errc::shutting_down, "producer closed"));
}

std::uint64_t producer::published_messages() const {
    return st_->published;
}

}  // namespace cg::nsq
