#include "nsq/message.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "net/tokens.hpp"
#include "nsq/connection.hpp"
#include "nsq/policy.hpp"

namespace cg::nsq {

message::message(const proto::message_view& v, std::shared_ptr<connection> conn,
                 const delivery_ticket& ticket, clock::time_point delivered,
                 std::chrono::milliseconds msg_timeout, std::chrono::milliseconds max_msg_timeout)
    : id_(v.id),
      attempts_(v.attempts),
      timestamp_(v.timestamp),
      body_(v.body),
      conn_(std::move(conn)),
      ticket_(ticket),
      delivered_(delivered),
      touched_(delivered),
      msg_timeout_(msg_timeout),
      max_msg_timeout_(max_msg_timeout) {}

void message::reset(const proto::message_view& v, const std::shared_ptr<connection>& conn,
                    const delivery_ticket& ticket, clock::time_point delivered,
                    std::chrono::milliseconds msg_timeout, std::chrono::milliseconds max_msg_timeout) {
    id_ = v.id;
    attempts_ = v.attempts;
    timestamp_ = v.timestamp;
    body_.assign(v.body);  // reuses the capacity
    if (conn_ != conn) conn_ = conn;
    ticket_ = ticket;
    delivered_ = delivered;
    touched_ = delivered;
    msg_timeout_ = msg_timeout;
    max_msg_timeout_ = max_msg_timeout;
}

message::~message() = default;

bool message::touch() {
    if (!conn_ || !conn_->touch(ticket_)) return false;
    touched_ = clock::now();
    return true;
}

struct keepalive::state {
    net::steady_timer timer;
    message* msg;
    bool stopped = false;
    std::size_t touches = 0;
};

namespace {

// TOUCHes until stopped, until the connection is gone, or until a TOUCH could no longer extend the
// deadline (nsqd's max-msg-timeout cap). Holds the state, not the message: after stop it never
// dereferences `msg`.
asio::awaitable<void> keepalive_loop(std::shared_ptr<keepalive::state> st) {
    // nsqd's deadline runs from delivery (or the last TOUCH), not from when the handler got round to
    // holding a keepalive (it may have waited for a slot or done other work first): the first TOUCH is due
    // msg_timeout / 2 after receipt or the last TOUCH — at once if that is already past — and each later
    // one msg_timeout / 2 after the last.
    auto last = st->msg->last_touched();
    for (;;) {
        auto next =
            next_touch(last, st->msg->delivered_at(), st->msg->msg_timeout(), st->msg->max_msg_timeout());
        if (!next) co_return;
        st->timer.expires_at(*next);
        co_await st->timer.async_wait();
        if (st->stopped) co_return;
        if (!st->msg->touch()) co_return;
        ++st->touches;
        last = clock::now();
    }
}

}  // namespace

keepalive::keepalive(message& m) {
    if (!m.conn()) return;
    auto ex = m.conn()->executor();
    st_ = std::make_shared<state>(state{net::steady_timer(ex), &m});
    asio::co_spawn(ex, keepalive_loop(st_), asio::detached);
}

keepalive::~keepalive() {
    if (!st_) return;
    st_->stopped = true;
    st_->timer.cancel();
}

std::size_t keepalive::touches() const noexcept {
    return st_ ? st_->touches : 0;
}

}  // namespace cg::nsq
