// One consumer connection to one nsqd: magic → IDENTIFY → SUB, then a read loop (frames → owner), a
// write queue, a heartbeat watchdog (2 × heartbeat_interval without a byte closes it) and the set of
// message ids in flight on it. The consumer's rdy_controller decides RDY; the connection only sends what it
// is told.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "net/tokens.hpp"
#include "nsq/config.hpp"
#include "nsq/message.hpp"
#include "nsq/proto/error_frame.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/proto/message.hpp"
#include "nsq/transport.hpp"

namespace cg::nsq {

class connection;

// What a connection reports to its consumer. Called on the connection's executor.
class connection_owner {
  public:
    virtual ~connection_owner() = default;
    virtual void on_subscribed(connection& c) = 0;
    // A message frame arrived and was added to the in-flight table as `t`.
    virtual void on_message(const std::shared_ptr<connection>& c, const proto::message_view& m,
                            delivery_ticket t) = 0;
    // All frames of one read were handled (RDY re-send point); also called when a frame of the read ended
    // the connection, for the messages before it.
    virtual void on_read_batch(connection& c) = 0;
    virtual void on_error_frame(connection& c, const proto::error_frame& e) = 0;
    virtual void on_touch_sent() = 0;
};

// The keepalives (message.hpp) of one connection's deliveries, with one timer armed for the earliest
// TOUCH due among them: a keepalive joins and leaves the list without an allocation or a timer of its own.
// When the timer fires every member whose TOUCH is due sends it; one whose TOUCH fails (the delivery was
// answered, the connection is gone) or could no longer extend nsqd's deadline leaves the list. A member due
// before the armed expiry moves the timer earlier; members mostly join in receipt order, so while
// deliveries stream through the timer is armed about once per msg_timeout / 2 (a member that leaves does
// not disarm it: it fires for the earliest one left, if any). Connection executor only.
class keepalive_list {
  public:
    explicit keepalive_list(asio::any_io_executor ex) : timer_(ex) {}
    keepalive_list(const keepalive_list&) = delete;
    keepalive_list& operator=(const keepalive_list&) = delete;

    // `owner` is the connection holding this list (the timer's callback finds the list through it).
    void add(keepalive& k, const std::shared_ptr<connection>& owner);
    void remove(keepalive& k) noexcept;

  private:
    void arm(std::chrono::steady_clock::time_point at, std::weak_ptr<connection> owner);
    void fired(std::weak_ptr<connection> owner);

    keepalive *head_ = nullptr, *tail_ = nullptr;
    net::steady_timer timer_;
    bool armed_ = false;
    std::chrono::steady_clock::time_point armed_at_{};
    std::uint64_t gen_ = 0;  // filters the completion of a wait a later arm() replaced
};

class connection : public std::enable_shared_from_this<connection> {
  public:
    enum class phase { connecting, subscribed, closing, closed };

    // `tls` is the consumer's TLS context (nullptr when TLS is off); it must outlive the connection.
    connection(asio::any_io_executor ex, std::string key, const consumer_config& cfg, connection_owner* owner,
               logger log, std::shared_ptr<asio::ssl::context> tls = nullptr);

    // Connects to the first of `eps` that answers, identifies (TLS, compression, AUTH), subscribes, then
    // serves until the connection ends (peer close, fatal error frame, heartbeat timeout, abort(), or a
    // graceful close after CLS). Returns why it ended (an empty error for a graceful close). Completes on the
    // connection's executor; `owner` and this object must outlive it (the caller holds a shared_ptr). Cancel
    // with abort().
    asio::awaitable<error> run(std::vector<net::tcp::endpoint> eps);

    // Commands (no-ops once the connection is ending: from the moment it failed or began its final close,
    // since no loop writes anything after that). FIN/REQ/TOUCH apply only to a delivery still in flight
    // on a connection that will write them; false otherwise (the caller counts the answer as not sent).
    // FIN and REQ end the delivery.
    void send_rdy(unsigned count);
    bool finish(delivery_ticket t);
    bool requeue(delivery_ticket t, std::chrono::milliseconds delay);
    bool touch(delivery_ticket t);
    // Sends CLS; the connection closes once nsqd answered CLOSE_WAIT and nothing is in flight.
    void start_close();
    // Closes the socket now; run() returns.
    void abort();

    phase state() const noexcept { return phase_; }
    bool subscribed() const noexcept { return phase_ == phase::subscribed; }
    bool ever_subscribed() const noexcept { return ever_subscribed_; }
    const std::string& key() const noexcept { return key_; }
    // Whether an answer (FIN/REQ/TOUCH) for `t` would still be sent: false once the delivery was answered
    // or the connection is ending. A delivery nobody can answer is redelivered by nsqd after msg_timeout.
    bool can_answer(delivery_ticket t) const noexcept { return in_flight(t); }
    std::size_t in_flight() const noexcept { return in_flight_total_; }
    const proto::identify_response& negotiated() const noexcept { return negotiated_; }
    std::chrono::milliseconds msg_timeout() const noexcept {
        return std::chrono::milliseconds(negotiated_.msg_timeout);
    }
    unsigned max_rdy() const noexcept { return static_cast<unsigned>(negotiated_.max_rdy_count); }
    asio::any_io_executor executor() const { return ex_; }
    // When the read that carried the frame being handled completed (a message's receipt time).
    std::chrono::steady_clock::time_point last_read() const noexcept { return last_read_; }
    // The keepalives of this connection's deliveries (message.hpp).
    keepalive_list& keepalives() noexcept { return keepalives_; }

  private:
    asio::awaitable<error> handshake(std::vector<net::tcp::endpoint> eps);
    asio::awaitable<void> read_loop();
    asio::awaitable<void> write_loop();
    asio::awaitable<void> watchdog();
    asio::awaitable<void> close_waiter();
    bool handle_frame(const proto::frame& f, const std::shared_ptr<connection>& self);
    void notify_writer();
    void check_drained();
    void fail(error e);
    // Inline: FIN goes through both once per message. `done_` is set (by fail() or stop_loops()) before the
    // phase becomes closed, while run()'s loops unwind over a few executor turns: a command queued then
    // would never be written, so the delivery counts as no longer answerable from that moment.
    bool in_flight(delivery_ticket t) const noexcept {
        return !done_ && phase_ != phase::closed && t.slot < slots_.size() && slots_[t.slot].used &&
               slots_[t.slot].gen == t.gen;
    }
    bool release(delivery_ticket t) {
        if (!in_flight(t)) return false;
        auto& sl = slots_[t.slot];
        sl.used = false;
        ++sl.gen;
        free_slots_.push_back(t.slot);
        --in_flight_total_;
        return true;
    }
    void stop_loops();

    asio::any_io_executor ex_;
    std::string key_;
    const consumer_config& cfg_;
    connection_owner* owner_;
    logger log_;
    std::shared_ptr<asio::ssl::context> tls_;
    transport io_;
    proto::frame_decoder decoder_;
    std::string out_, sending_;
    net::steady_timer writer_wake_, drained_wake_;
    bool writer_waiting_ = false, writing_ = false;
    bool close_wait_ = false;
    bool done_ = false;
    bool ever_subscribed_ = false;
    phase phase_ = phase::connecting;
    error end_;
    proto::identify_response negotiated_;
    // Deliveries still unanswered here, one slot each (free slots are reused; a slot's generation changes
    // whenever it is released). nsqd may redeliver an id to this same connection after it timed out: both
    // deliveries are handled and each answer is sent (nsqd judges the late one).
    struct slot {
        proto::message_id id;
        std::uint32_t gen = 0;
        bool used = false;
    };
    std::vector<slot> slots_;
    std::vector<std::uint32_t> free_slots_;
    std::size_t in_flight_total_ = 0;
    std::chrono::steady_clock::time_point last_read_{};
    keepalive_list keepalives_;
};

}  // namespace cg::nsq
