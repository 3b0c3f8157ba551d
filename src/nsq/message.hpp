// A message handed to a consumer handler: it owns its body (copied out of the read buffer), knows the
// connection it came on (for TOUCH/FIN/REQ), and the handler's answer (disposition).
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "nsq/proto/message.hpp"

namespace cg::nsq {

class connection;

// One delivery's place in its connection's in-flight table: FIN/REQ/TOUCH find it without a lookup by id,
// and a stale ticket (the delivery already answered, or the connection gone) is recognised.
struct delivery_ticket {
    std::uint32_t slot = 0;
    std::uint32_t gen = 0;
};

class message {
  public:
    using clock = std::chrono::steady_clock;
    message(const proto::message_view& v, std::shared_ptr<connection> conn, const delivery_ticket& ticket,
            clock::time_point delivered, std::chrono::milliseconds msg_timeout,
            std::chrono::milliseconds max_msg_timeout);
    message(message&&) noexcept = default;
    message& operator=(message&&) noexcept = default;
    ~message();

    std::string_view id() const noexcept { return id_.view(); }     // 16 ASCII bytes
    std::uint16_t attempts() const noexcept { return attempts_; }   // 1 on first delivery
    std::int64_t timestamp() const noexcept { return timestamp_; }  // ns since the epoch, set at publish
    const std::string& body() const noexcept { return body_; }
    // Moves the body out (body() is empty afterwards): for a handler that keeps the body for the whole
    // delivery, so an in-flight message holds it once, not twice.
    std::string take_body() noexcept { return std::exchange(body_, std::string()); }

    // Sends TOUCH: nsqd resets this message's timeout to now + msg_timeout (capped at delivery +
    // max_msg_timeout). Returns false, sending nothing, when the connection it came on is gone or the
    // message is no longer in flight there. Call on the consumer's executor.
    bool touch();
    // When nsqd's timeout for it last started: its receipt, or the last TOUCH sent (by the consumer while
    // it waited for a handler, or by a keepalive).
    clock::time_point last_touched() const noexcept { return touched_; }

    std::chrono::milliseconds msg_timeout() const noexcept { return msg_timeout_; }          // effective
    std::chrono::milliseconds max_msg_timeout() const noexcept { return max_msg_timeout_; }  // nsqd's cap
    clock::time_point delivered_at() const noexcept { return delivered_; }

    // The connection the message came on and its place there (internal: the consumer and keepalive).
    const std::shared_ptr<connection>& conn() const noexcept { return conn_; }
    delivery_ticket ticket() const noexcept { return ticket_; }
    // Internal (the consumer's message pool): this object takes a new delivery, keeping the body's storage
    // (no allocation when it is large enough) and its connection reference when it is the same connection
    // (no reference count change per message); release_connection() lets a pooled message drop its
    // connection so a closed connection is not kept alive by the pool.
    void reset(const proto::message_view& v, const std::shared_ptr<connection>& conn,
               const delivery_ticket& ticket, clock::time_point delivered,
               std::chrono::milliseconds msg_timeout, std::chrono::milliseconds max_msg_timeout);
    void release_connection() noexcept { conn_.reset(); }
    std::size_t body_capacity() const noexcept { return body_.capacity(); }

  private:
    proto::message_id id_;
    std::uint16_t attempts_ = 0;
    std::int64_t timestamp_ = 0;
    std::string body_;
    std::shared_ptr<connection> conn_;
    delivery_ticket ticket_;
    clock::time_point delivered_, touched_;
    std::chrono::milliseconds msg_timeout_, max_msg_timeout_;
};

// What a handler decided.
class disposition {
  public:
    enum class kind { finish, requeue, requeue_without_backoff };

    static disposition finish() { return disposition(kind::finish, std::nullopt); }
    // REQ and count a failure (go-nsq backoff). Without a delay: default_requeue_delay · attempts.
    static disposition requeue(std::optional<std::chrono::milliseconds> delay = std::nullopt) {
        return disposition(kind::requeue, delay);
    }
    // REQ without touching the backoff state ("not now", e.g. a lease held by another worker).
    static disposition requeue_without_backoff(
        std::optional<std::chrono::milliseconds> delay = std::nullopt) {
        return disposition(kind::requeue_without_backoff, delay);
    }

    kind what() const noexcept { return kind_; }
    std::optional<std::chrono::milliseconds> delay() const noexcept { return delay_; }

  private:
    disposition(kind k, std::optional<std::chrono::milliseconds> d) : kind_(k), delay_(d) {}
    kind kind_;
    std::optional<std::chrono::milliseconds> delay_;
};

// The handler the billing pipeline (or `tail`) gives the consumer. Runs on the consumer's executor; the
// message stays valid until the returned awaitable completes. A handler says what to do with the message by
// its disposition, never by throwing: an exception is a bug in the handler, logged with the message id,
// counted (chargeguard_nsq_handler_errors_total) and answered with requeue() so the message is not lost.
using message_handler = std::function<asio::awaitable<disposition>(message&)>;
// Called instead of the handler once attempts > max_attempts, with the same contract: its disposition is
// applied (finish → counted as given up; a requeue keeps the message). Without one the consumer FINs.
using give_up_handler = std::function<asio::awaitable<disposition>(message&)>;

class keepalive_list;

// Holds a message alive while a handler awaits slow work: TOUCHes every effective msg_timeout / 2 and
// stops before nsqd's max-msg-timeout cap, where a TOUCH can no longer help. Construct on the
// consumer's executor; destroy (normally: leave scope) before the handler returns. The message must
// outlive the keepalive. It joins its connection's keepalive_list (connection.hpp), whose one timer
// sends the TOUCHes of all of them: constructing and destroying one allocates nothing and arms no timer
// (nearly every delivery ends long before its first TOUCH is due).
class keepalive {
  public:
    explicit keepalive(message& m);
    ~keepalive();
    keepalive(const keepalive&) = delete;
    keepalive& operator=(const keepalive&) = delete;

    std::size_t touches() const noexcept { return touches_; }

  private:
    friend class keepalive_list;
    message* msg_;
    keepalive_list* list_ = nullptr;  // null once it keeps nothing alive (stopped, or never started)
    keepalive *prev_ = nullptr, *next_ = nullptr;
    message::clock::time_point last_;  // when nsqd's deadline last started (receipt or the last TOUCH)
    std::size_t touches_ = 0;
};

}  // namespace cg::nsq
