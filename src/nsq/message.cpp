#include "nsq/message.hpp"

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
    clock::time_point last;  // when nsqd's deadline last started (receipt or the last TOUCH)
    bool stopped = false;
    std::size_t touches = 0;
};

namespace {

// Waits for the next TOUCH and sends it, until stopped, until the connection is gone, or until a TOUCH could
// no longer extend the deadline (nsqd's max-msg-timeout cap). A plain timer callback holding the state, not
// the message: after stop it never dereferences `msg`. (Every delivery holds a keepalive and nearly all end
// long before their first TOUCH: no coroutine is started for one.)
void arm(std::shared_ptr<keepalive::state> st) {
    // nsqd's deadline runs from delivery (or the last TOUCH), not from when the handler got round to
    // holding a keepalive (it may have waited for a slot or done other work first): the first TOUCH is due
    // msg_timeout / 2 after receipt or the last TOUCH — at once if that is already past — and each later
    // one msg_timeout / 2 after the last.
    auto next =
        next_touch(st->last, st->msg->delivered_at(), st->msg->msg_timeout(), st->msg->max_msg_timeout());
    if (!next) return;
    auto& timer = st->timer;
    timer.expires_at(*next);
    timer.async_wait([st = std::move(st)](std::error_code) mutable {
        if (st->stopped) return;
        if (!st->msg->touch()) return;
        ++st->touches;
        st->last = clock::now();
        arm(std::move(st));
    });
}

}  // namespace

keepalive::keepalive(message& m) {
    if (!m.conn()) return;
    st_ = std::make_shared<state>(state{net::steady_timer(m.conn()->executor()), &m, m.last_touched()});
    arm(st_);
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
