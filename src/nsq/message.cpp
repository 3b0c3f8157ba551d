#include "nsq/message.hpp"

#include <optional>

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

keepalive::keepalive(message& m) : msg_(&m), last_(m.last_touched()) {
    if (m.conn()) m.conn()->keepalives().add(*this, m.conn());
}

keepalive::~keepalive() {
    if (list_) list_->remove(*this);
}

// nsqd's deadline runs from delivery (or the last TOUCH), not from when the handler got round to holding a
// keepalive (it may have waited for a slot or done other work first): the first TOUCH is due msg_timeout / 2
// after receipt or the last TOUCH — at once if that is already past — and each later one msg_timeout / 2
// after the last.
void keepalive_list::add(keepalive& k, const std::shared_ptr<connection>& owner) {
    const auto& m = *k.msg_;
    auto due = next_touch(k.last_, m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
    if (!due) return;
    k.list_ = this;
    k.prev_ = tail_;
    k.next_ = nullptr;
    (tail_ ? tail_->next_ : head_) = &k;
    tail_ = &k;
    if (!armed_ || *due < armed_at_) arm(*due, owner);
}

void keepalive_list::remove(keepalive& k) noexcept {
    (k.prev_ ? k.prev_->next_ : head_) = k.next_;
    (k.next_ ? k.next_->prev_ : tail_) = k.prev_;
    k.prev_ = k.next_ = nullptr;
    k.list_ = nullptr;
}

void keepalive_list::arm(clock::time_point at, std::weak_ptr<connection> owner) {
    armed_ = true;
    armed_at_ = at;
    auto gen = ++gen_;
    timer_.expires_at(at);  // cancels a wait pending: its completion sees another generation
    // Through the connection, not `this`: the list is a member of it and may be gone by the completion.
    timer_.async_wait([owner = std::move(owner), gen](std::error_code) {
        auto c = owner.lock();
        if (!c) return;
        auto& l = c->keepalives();
        if (l.gen_ != gen) return;
        l.armed_ = false;
        l.fired(owner);
    });
}

void keepalive_list::fired(std::weak_ptr<connection> owner) {
    auto now = clock::now();
    std::optional<clock::time_point> first;
    for (auto* k = head_; k;) {
        auto* next = k->next_;
        const auto& m = *k->msg_;
        auto due = next_touch(k->last_, m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
        if (due && *due <= now) {
            if (k->msg_->touch()) {
                ++k->touches_;
                k->last_ = clock::now();
                due = next_touch(k->last_, m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
            } else {
                due.reset();  // answered, or the connection is gone: nothing left to keep alive
            }
        }
        if (!due) {
            remove(*k);
        } else if (!first || *due < *first) {
            first = due;
        }
        k = next;
    }
    if (first) arm(*first, std::move(owner));
}

}  // namespace cg::nsq
