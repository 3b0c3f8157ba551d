#include "nsq/connection.hpp"

#include <asio/connect.hpp>
#include <asio/write.hpp>

#include "net/address.hpp"
#include "net/timeout.hpp"
#include "nsq/handshake.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

connection::connection(asio::any_io_executor ex, std::string key, const consumer_config& cfg,
                       connection_owner* owner, logger log, std::shared_ptr<asio::ssl::context> tls)
    : ex_(ex),
      key_(std::move(key)),
      cfg_(cfg),
      owner_(owner),
      log_(log.with({{"nsqd", key_}})),
      tls_(std::move(tls)),
      io_(ex),
      decoder_(cfg.max_frame_size),
      writer_wake_(ex, sclock::time_point::max()),
      drained_wake_(ex, sclock::time_point::max()),
      keepalives_(ex) {}

asio::awaitable<error> connection::run(std::vector<net::tcp::endpoint> eps) {
    auto self = shared_from_this();
    if (auto e = co_await handshake(std::move(eps))) {
        fail(e);
    } else {
        phase_ = phase::subscribed;
        ever_subscribed_ = true;
        last_read_ = sclock::now();
        slots_.reserve(cfg_.max_in_flight);
        owner_->on_subscribed(*this);
        // The first loop to end ends the others (net/timeout.hpp).
        co_await net::race(read_loop(), write_loop(), watchdog(), close_waiter());
    }
    phase_ = phase::closed;
    for (auto& sl : slots_) sl.used = false;  // tickets fail on the closed phase anyway
    in_flight_total_ = 0;
    io_.close();
    writer_wake_.cancel();
    drained_wake_.cancel();
    co_return end_;
}

// Connect → magic + IDENTIFY → negotiated reply (+ TLS, compression, AUTH) → SUB → OK, all within
// connect_timeout.
asio::awaitable<error> connection::handshake(std::vector<net::tcp::endpoint> eps) {
    auto deadline = sclock::now() + cfg_.connect_timeout;
    if (auto e = co_await io_.connect(std::move(eps), cfg_.connect_timeout, key_)) co_return e;
    io_.set_no_delay();

    handshake_options o;
    o.identify.client_id = cfg_.client_id.empty() ? short_hostname() : cfg_.client_id;
    o.identify.hostname = cfg_.hostname.empty() ? local_hostname() : cfg_.hostname;
    o.identify.user_agent = cfg_.user_agent;
    o.identify.heartbeat_interval_ms = cfg_.heartbeat_interval.count();
    o.identify.msg_timeout_ms = cfg_.msg_timeout.count();
    o.security = &cfg_.security;
    o.tls = tls_.get();
    o.tls_host = cfg_.security.tls_server_name.empty() ? net::parse_host_port(key_)->host
                                                       : cfg_.security.tls_server_name;
    o.what = key_;
    auto neg = co_await nsq::handshake(io_, decoder_, o, deadline, log_);
    if (!neg) co_return neg.err();
    negotiated_ = *neg;

    std::string out;
    proto::append_sub(out, cfg_.topic, cfg_.channel);
    auto [wec, wn] = co_await io_.write(out);
    if (wec) co_return error(wec, "writing SUB");
    for (;;) {
        auto f = co_await read_frame(io_, decoder_, deadline, key_);
        if (!f) co_return f.err();
        if (f->type == proto::frame_type::error)
            co_return error(errc::server_error, "SUB: " + std::string(f->data));
        if (f->type == proto::frame_type::response && f->data == "OK") break;
        if (f->type == proto::frame_type::response && f->data == "_heartbeat_") {
            out.clear();
            proto::append_nop(out);
            std::tie(wec, wn) = co_await io_.write(out);
            if (wec) co_return error(wec, "writing NOP");
            continue;
        }
        co_return error(errc::bad_response, "unexpected reply to SUB");
    }
    // topic and channel are already fields of the consumer's logger this one derives from.
    log_.info("subscribed", {{"msg_timeout_ms", negotiated_.msg_timeout},
                             {"max_rdy_count", negotiated_.max_rdy_count},
                             {"tls", io_.tls()},
                             {"compression", io_.compression()},
                             {"nsqd_version", negotiated_.version}});
    co_return error{};
}

asio::awaitable<void> connection::read_loop() {
    auto self = shared_from_this();  // handed to on_message (one reference count per read, not per message)
    for (;;) {
        auto area = decoder_.prepare(64 * 1024);
        auto [ec, n] = co_await io_.read_some(asio::buffer(area.data(), area.size()));
        if (done_) co_return;
        if (ec) {
            fail(error(ec == asio::error::eof ? make_error_code(errc::connection_closed) : ec, "read"));
            co_return;
        }
        last_read_ = sclock::now();
        decoder_.commit(n);
        proto::frame f;
        bool ok = true;
        for (;;) {
            auto st = decoder_.next(f);
            if (st == proto::decode_status::need_more) break;
            if (st == proto::decode_status::error) {
                fail(decoder_.last_error());
                ok = false;
                break;
            }
            if (!handle_frame(f, self)) {
                ok = false;
                break;
            }
        }
        // Also after a failure: the owner counts a read's messages here, and those before the bad frame
        // were delivered.
        owner_->on_read_batch(*this);
        if (!ok) co_return;
        if (!out_.empty()) notify_writer();
    }
}

// One frame; false ends the connection.
bool connection::handle_frame(const proto::frame& f, const std::shared_ptr<connection>& self) {
    switch (f.type) {
        case proto::frame_type::message: {
            proto::message_view m;
            if (!proto::parse_message(f.data, m)) {
                fail(proto::parse_message(f.data).err());  // the same check again, for its error
                return false;
            }
            if (m.attempts > 1) {  // only a redelivery can meet an earlier delivery of its id still here
                for (const auto& sl : slots_)
                    if (sl.used && sl.id == m.id) {
                        log_.warn(
                            "message redelivered while its earlier delivery is still being handled (it "
                            "timed out)",
                            {{"id", m.id.view()}, {"attempts", m.attempts}});
                        break;
                    }
            }
            delivery_ticket t;
            if (free_slots_.empty()) {
                t.slot = static_cast<std::uint32_t>(slots_.size());
                slots_.emplace_back();
            } else {
                t.slot = free_slots_.back();
                free_slots_.pop_back();
            }
            auto& sl = slots_[t.slot];
            sl.id = m.id;
            sl.used = true;
            t.gen = sl.gen;
            ++in_flight_total_;
            owner_->on_message(self, m, t);
            return true;
        }
        case proto::frame_type::response:
            if (f.data == "_heartbeat_") {
                proto::append_nop(out_);
            } else if (f.data == "CLOSE_WAIT") {
                close_wait_ = true;
                check_drained();
            }
            return true;
        case proto::frame_type::error: {
            auto e = proto::classify_error(f.data);
            owner_->on_error_frame(*this, e);
            if (e.fatal) {
                fail(error(errc::server_error, std::string(f.data)));
                return false;
            }
            return true;
        }
    }
    return true;
}

asio::awaitable<void> connection::write_loop() {
    for (;;) {
        while (out_.empty()) {
            if (done_) co_return;
            writer_waiting_ = true;
            co_await writer_wake_.async_wait();
            writer_waiting_ = false;
        }
        if (done_) co_return;
        std::swap(out_, sending_);
        writing_ = true;
        auto [ec, n] = co_await io_.write(sending_);
        writing_ = false;
        sending_.clear();
        if (done_) co_return;
        if (ec) {
            fail(error(ec, "write"));
            co_return;
        }
        check_drained();
    }
}

// nsqd sends a heartbeat every interval whatever else it sends; two missed mean it is gone.
asio::awaitable<void> connection::watchdog() {
    auto limit = 2 * cfg_.heartbeat_interval;
    for (;;) {
        if (!co_await net::sleep_for(cfg_.heartbeat_interval / 4) || done_) co_return;
        if (sclock::now() - last_read_ > limit) {
            fail(error(errc::heartbeat_timeout,
                       "nothing from nsqd for " + std::to_string(limit.count()) + " ms"));
            co_return;
        }
    }
}

// Ends the connection gracefully once CLOSE_WAIT came, nothing is in flight and the queue is written.
asio::awaitable<void> connection::close_waiter() {
    for (;;) {
        co_await drained_wake_.async_wait();
        if (done_) co_return;
        if (close_wait_ && in_flight_total_ == 0 && out_.empty() && !writing_) {
            stop_loops();
            co_return;
        }
    }
}

void connection::check_drained() {
    if (close_wait_ && in_flight_total_ == 0 && out_.empty() && !writing_) drained_wake_.cancel();
}

// Once per burst of commands (every FIN of a read batch lands here): the first wakes the writer, the
// rest find it already woken.
void connection::notify_writer() {
    if (!writer_waiting_) return;
    writer_waiting_ = false;
    writer_wake_.cancel();
}

void connection::fail(error e) {
    if (!end_ && phase_ != phase::closed) end_ = std::move(e);
    stop_loops();
}

// Wakes every loop of run() so each returns by itself (not relying on || cancellation).
void connection::stop_loops() {
    if (done_) return;
    done_ = true;
    io_.cancel();
    writer_wake_.cancel();
    drained_wake_.cancel();
}

void connection::send_rdy(unsigned count) {
    if (phase_ == phase::closed || done_) return;
    proto::append_rdy(out_, count);
    notify_writer();
}

bool connection::finish(delivery_ticket t) {
    if (!release(t)) return false;
    proto::append_fin(out_, slots_[t.slot].id.view());
    notify_writer();
    check_drained();
    return true;
}

bool connection::requeue(delivery_ticket t, milliseconds delay) {
    if (!release(t)) return false;
    proto::append_req(out_, slots_[t.slot].id.view(),
                      static_cast<std::uint64_t>(std::max<long long>(0, delay.count())));
    notify_writer();
    check_drained();
    return true;
}

bool connection::touch(delivery_ticket t) {
    if (!in_flight(t)) return false;
    proto::append_touch(out_, slots_[t.slot].id.view());
    notify_writer();
    owner_->on_touch_sent();
    return true;
}

void connection::start_close() {
    if (phase_ != phase::subscribed || done_) return;
    phase_ = phase::closing;
    proto::append_cls(out_);
    notify_writer();
}

void connection::abort() {
    if (phase_ == phase::closed) return;
    fail(error(errc::shutting_down, "connection aborted"));
    io_.close();
}

}  // namespace cg::nsq
