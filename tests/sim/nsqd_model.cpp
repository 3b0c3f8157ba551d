// nsqd: at-least-once delivery, message timeouts and TOUCH, REQ, FIN refused for a stale attempt, a day-long
// outage now and then.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "billing/machine/event.hpp"
#include "world.hpp"

namespace cg::sim::detail {

void world::publish(int event) {
    message m;
    m.event = event;
    m.body = billing::to_json(events_[event].ev);
    messages_.push_back(std::move(m));
    int id = static_cast<int>(messages_.size()) - 1;
    at(now_ + rnd_.range(1, 50), [this, id] { deliver(id); });
}

void world::deliver(int id) {
    message& m = messages_[id];
    if (m.done || m.inflight) return;
    std::vector<int> up;
    for (int i = 0; i < static_cast<int>(sidecars_.size()); ++i)
        if (sidecars_[i].up) up.push_back(i);
    if (up.empty()) {
        at(std::max(now_ + sec, fleet_down_until_), [this, id] { deliver(id); });
        return;
    }
    int sc = up[rnd_.next() % up.size()];
    ++m.attempts;
    m.token = ++tokens_;
    m.inflight = true;
    m.timeout_at = now_ + p_.msg_timeout;
    ++result_.deliveries;
    delivery d;
    d.msg = id;
    d.token = m.token;
    d.sidecar = sc;
    d.incarnation = sidecars_[sc].incarnation;
    deliveries_.push_back(std::move(d));
    int did = static_cast<int>(deliveries_.size()) - 1;
    note("deliver m" + std::to_string(id) + " to s" + std::to_string(sc));
    at(m.timeout_at, [this, id, tok = m.token] { timeout_check(id, tok); });
    at(now_ + pg(), [this, did] { start(did); });
}

void world::timeout_check(int id, std::uint64_t token) {
    message& m = messages_[id];
    if (!m.inflight || m.token != token) return;
    if (now_ < m.timeout_at) {
        at(m.timeout_at, [this, id, token] { timeout_check(id, token); });
        return;
    }
    m.inflight = false;  // nsqd redelivers; the worker that had it may still be running
    ms_t held = day_outage();
    at(now_ + held, [this, id] { deliver(id); });
}

// nsqd, or the whole fleet, down for a day now and then: the message comes back after it. When it is the
// fleet, every sidecar — its deliveries and its sweeper — is down meanwhile.
ms_t world::day_outage() {
    if (!fault(0.01)) return 0;
    const ms_t held = rnd_.range(24 * hour, 27 * hour);
    if (rnd_.chance(0.5)) {
        note("the fleet is down for " + std::to_string(held / minute) + " min");
        fleet_down_until_ = std::max(fleet_down_until_, now_ + held);
        for (int sc = 0; sc < static_cast<int>(sidecars_.size()); ++sc) crash(sc);
    }
    return held;
}

void world::fin(const delivery& d) {
    if (d.swept) return;  // the sweeper's: no message
    message& m = messages_[d.msg];
    if (m.inflight && m.token == d.token) {
        m.inflight = false;
        m.done = true;
    }
}

void world::req(const delivery& d, ms_t delay) {
    if (d.swept) return;  // the sweeper's: no message
    message& m = messages_[d.msg];
    if (!m.inflight || m.token != d.token) return;
    m.inflight = false;
    ms_t held = day_outage();
    int id = d.msg;
    at(now_ + delay + held, [this, id] { deliver(id); });
}

void world::touch(const delivery& d) {
    if (d.swept) return;  // the sweeper's: no message
    message& m = messages_[d.msg];
    if (m.inflight && m.token == d.token && !fault(0.05)) m.timeout_at = now_ + p_.msg_timeout;
}

}  // namespace cg::sim::detail
