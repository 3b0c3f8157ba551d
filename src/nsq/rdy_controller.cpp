#include "nsq/rdy_controller.hpp"

#include <algorithm>

namespace cg::nsq {

using namespace std::chrono;

rdy_controller::rdy_controller(rdy_settings s) : s_(s), backoff_(s.backoff_multiplier, s.max_backoff) {}

rdy_output rdy_controller::start() {
    rdy_output out;
    if (!stopping_) arm(out, rdy_timer::redistribute, s_.redistribute_interval);
    return out;
}

rdy_output rdy_controller::connection_added(const std::string& conn, unsigned max_rdy,
                                            clock::time_point now) {
    rdy_output out;
    if (stopping_) return out;
    auto& c = conns_[conn];
    orphans_ += c.outstanding;  // a connection of that key never reported removed (a restarted task)
    c = conn_state{};
    c.max_rdy = max_rdy;
    c.last_active = now;
    rebalance(out, now);
    keep_backoff_going(out);
    return out;
}

rdy_output rdy_controller::connection_removed(const std::string& conn, clock::time_point now) {
    rdy_output out;
    auto it = conns_.find(conn);
    if (it == conns_.end()) return out;
    // Its deliveries still being handled keep their place in the budget until their handlers finish.
    orphans_ += it->second.outstanding;
    conns_.erase(it);
    if (stopping_) return out;
    rebalance(out, now);
    keep_backoff_going(out);
    return out;
}

void rdy_controller::messages_received(const std::string& conn, unsigned n, clock::time_point now) {
    if (n == 0) return;
    pending_ += n;
    auto it = conns_.find(conn);
    if (it == conns_.end()) {
        orphans_ += n;  // a connection not (or no longer) planned for: stopping
        return;
    }
    it->second.outstanding += n;
    it->second.remaining -= std::min(it->second.remaining, n);
    it->second.last_active = now;
}

rdy_output rdy_controller::read_batch_done(const std::string& conn) {
    rdy_output out;
    if (stopping_ || backoff_.backing_off()) return out;
    auto it = conns_.find(conn);
    if (it == conns_.end()) return out;
    auto& c = it->second;
    if (c.sent == 0) return out;
    if (c.remaining <= 1 || c.remaining < c.sent / 4) {
        out.rdy.push_back({conn, c.sent});
        c.remaining = c.sent;
    }
    return out;
}

rdy_output rdy_controller::handler_finished(std::string_view conn, handler_signal s, clock::time_point now) {
    rdy_output out;
    bool frees = would_free(conn);
    take_finished(conn, 1);
    if (stopping_) return out;
    switch (s) {
        case handler_signal::success:
            act(out, backoff_.on_success(), now);
            break;
        case handler_signal::failure:
            act(out, backoff_.on_failure(), now);
            break;
        case handler_signal::neutral:
            act(out, backoff_.on_continue(), now);
            break;
    }
    if (frees) rebalance(out, now, false);  // a connection held back for this delivery gets its RDY
    return out;
}

bool rdy_controller::finish_quietly(std::string_view conn, handler_signal s) noexcept {
    if (!stopping_) {
        if (s != handler_signal::success || backoff_.backing_off()) return false;
        if (would_free(conn) && held_back()) return false;
    }
    take_finished(conn, 1);
    return true;
}

rdy_output rdy_controller::deliveries_dropped(std::string_view conn, unsigned n, clock::time_point now) {
    rdy_output out;
    if (n == 0) return out;
    auto before = total_load();
    take_finished(conn, n);
    if (stopping_) return out;
    if (total_load() < before) rebalance(out, now, false);
    keep_backoff_going(out);  // the dropped ones may have been what a backoff waited for
    return out;
}

// Which count a finished delivery comes off: its connection's while that is known, else the orphans'.
void rdy_controller::take_finished(std::string_view conn, unsigned n) noexcept {
    pending_ -= std::min<std::uint64_t>(pending_, n);
    auto it = conn.empty() ? conns_.end() : conns_.find(conn);
    if (it != conns_.end()) {
        auto k = std::min(it->second.outstanding, n);
        it->second.outstanding -= k;
        n -= k;
    }
    orphans_ -= std::min<std::uint64_t>(orphans_, n);
}

// Whether one delivery of `conn` finishing lowers the total load: an orphan always does; a connection's
// only while it holds more deliveries than its RDY (it was lowered under them).
bool rdy_controller::would_free(std::string_view conn) const noexcept {
    auto it = conn.empty() ? conns_.end() : conns_.find(conn);
    if (it != conns_.end() && it->second.outstanding > 0)
        return it->second.outstanding > it->second.committed;
    return orphans_ > 0;
}

bool rdy_controller::held_back() const noexcept {
    for (const auto& [k, c] : conns_)
        if (c.target > c.sent) return true;
    return false;
}

std::uint64_t rdy_controller::total_load() const noexcept {
    std::uint64_t t = orphans_;
    for (const auto& [k, c] : conns_) t += load(c);
    return t;
}

rdy_output rdy_controller::timer_fired(rdy_timer t, clock::time_point now) {
    rdy_output out;
    auto& armed = armed_[static_cast<std::size_t>(t)];
    if (!armed) return out;
    armed = false;
    if (stopping_) return out;
    switch (t) {
        case rdy_timer::settle:
            for (auto& [k, c] : conns_)
                if (c.settles_at && *c.settles_at <= now) {
                    c.committed = c.sent;
                    c.settles_at.reset();
                }
            schedule_settle(out, now);  // for decreases made since this timer was armed
            rebalance(out, now, false);
            break;
        case rdy_timer::backoff:
            backoff_.timeout_expired();
            resume_one(out, now);
            break;
        case rdy_timer::redistribute:
            rebalance(out, now);
            arm(out, rdy_timer::redistribute, s_.redistribute_interval);
            break;
    }
    return out;
}

rdy_output rdy_controller::set_max_in_flight(unsigned n, clock::time_point now) {
    rdy_output out;
    s_.max_in_flight = n;
    if (!stopping_) rebalance(out, now);
    return out;
}

rdy_output rdy_controller::stop() {
    rdy_output out;
    if (stopping_) return out;
    stopping_ = true;
    for (auto& [k, c] : conns_) {
        out.rdy.push_back({k, 0});
        c.sent = 0;
        c.remaining = 0;
        c.target = 0;
    }
    return out;
}

unsigned rdy_controller::rdy(const std::string& conn) const {
    auto it = conns_.find(conn);
    return it == conns_.end() ? 0 : it->second.sent;
}

unsigned rdy_controller::outstanding(const std::string& conn) const {
    auto it = conns_.find(conn);
    return it == conns_.end() ? 0 : it->second.outstanding;
}

std::uint64_t rdy_controller::total_sent() const {
    std::uint64_t t = 0;
    for (const auto& [k, c] : conns_) t += c.sent;
    return t;
}

std::uint64_t rdy_controller::committed_total() const {
    std::uint64_t t = 0;
    for (const auto& [k, c] : conns_) t += c.committed;
    return t;
}

void rdy_controller::note_committed() {
    max_committed_ = std::max(max_committed_, committed_total());
}

void rdy_controller::arm(rdy_output& out, rdy_timer t, milliseconds after) {
    armed_[static_cast<std::size_t>(t)] = true;
    out.timers.push_back({t, after});
}

// Sends RDY n. A decrease keeps the old value "committed" until the settle timer: nsqd may not have
// applied it yet, so the freed budget is not handed to another connection before then.
void rdy_controller::set_rdy(rdy_output& out, const std::string& key, conn_state& c, unsigned n,
                             clock::time_point now) {
    if (n == c.sent && n == c.remaining) return;
    if (c.sent == 0 && n > 0) c.last_active = now;
    out.rdy.push_back({key, n});
    if (n >= c.committed) {
        c.committed = n;
        c.settles_at.reset();
    } else {
        // Each decrease gets its own full settle delay (a later one extends it).
        c.settles_at = now + s_.settle_delay;
        schedule_settle(out, now);
    }
    c.sent = n;
    c.remaining = n;
    note_committed();
}

// Arms the settle timer for the earliest pending decrease, unless armed (an armed one is never later:
// every decrease settles settle_delay after it was sent, and the timer re-arms itself for the rest).
void rdy_controller::schedule_settle(rdy_output& out, clock::time_point now) {
    if (armed_[static_cast<std::size_t>(rdy_timer::settle)]) return;
    std::optional<clock::time_point> first;
    for (const auto& [k, c] : conns_)
        if (c.settles_at && (!first || *c.settles_at < *first)) first = c.settles_at;
    if (!first) return;
    arm(out, rdy_timer::settle, std::max(milliseconds(1), ceil<milliseconds>(*first - now)));
}

// Applies each connection's planned RDY: decreases now, increases within what max_in_flight leaves once
// the others' load is counted — each one's committed RDY or the deliveries it still has in hand, whichever
// is larger, plus the orphans (the rest after the settle delay, or as those deliveries finish). `recompute`
// makes a new plan (plan_rdy) first; the settle timer and finishing deliveries apply the pending one as
// it was.
void rdy_controller::rebalance(rdy_output& out, clock::time_point now, bool recompute) {
    if (stopping_ || backoff_.backing_off() || conns_.empty()) return;
    if (recompute) {
        std::vector<rdy_conn> in;
        in.reserve(conns_.size());
        for (const auto& [k, c] : conns_) in.push_back({c.sent, c.max_rdy, now - c.last_active});
        auto target = plan_rdy(in, s_.max_in_flight, s_.low_rdy_idle_timeout, rr_cursor_);
        std::size_t i = 0;
        for (auto& [k, c] : conns_) c.target = target[i++];
    }
    for (auto& [k, c] : conns_)
        if (c.target < c.sent) set_rdy(out, k, c, c.target, now);
    for (auto& [k, c] : conns_) {
        if (c.target <= c.sent) continue;
        auto others = total_load() - load(c);
        unsigned room = others >= s_.max_in_flight ? 0 : s_.max_in_flight - static_cast<unsigned>(others);
        unsigned allowed = std::min(c.target, room);
        if (allowed > c.sent) set_rdy(out, k, c, allowed, now);
        if (allowed < c.target) schedule_settle(out, now);
    }
}

void rdy_controller::act(rdy_output& out, backoff_policy::decision d, clock::time_point now) {
    if (d.act == backoff_policy::action::resume_all) {
        out.notes.push_back({rdy_output::note_kind::backoff_ended, 0, milliseconds(0), {}});
        rebalance(out, now);
    } else if (d.act == backoff_policy::action::backoff) {
        out.notes.push_back({rdy_output::note_kind::backoff_started, backoff_.level(), d.duration, {}});
        for (auto& [k, c] : conns_) set_rdy(out, k, c, 0, now);
        arm(out, rdy_timer::backoff, d.duration);
    }
}

// While backing off, something must always be under way: the backoff timer, the trial RDY 1 on a live
// connection, or a handler whose result decides the next step. When the connection holding the trial
// RDY 1 drops (or the trial never found a connection), none is: arm the timer again so a new trial goes
// out — otherwise RDY stays 0 everywhere with no handler running, for ever.
void rdy_controller::keep_backoff_going(rdy_output& out) {
    backoff_progress p{backoff_.backing_off(), backoff_.in_timeout(), false, pending_ > 0};
    for (const auto& [k, c] : conns_)
        if (c.sent > 0) p.trial_out = true;
    if (!backoff_needs_rearm(p)) return;
    backoff_.on_continue();  // back in the timeout
    auto after = backoff_.duration_for(backoff_.level());
    out.notes.push_back({rdy_output::note_kind::trial_lost, backoff_.level(), after, {}});
    arm(out, rdy_timer::backoff, after);
}

// After a backoff timeout: RDY 1 on one connection to test the waters (go-nsq), round-robin.
void rdy_controller::resume_one(rdy_output& out, clock::time_point now) {
    if (!backoff_.backing_off()) {
        rebalance(out, now);
        return;
    }
    if (conns_.empty()) {
        backoff_.on_continue();  // re-arms the timeout flag
        arm(out, rdy_timer::backoff, seconds(1));
        return;
    }
    auto it = conns_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(trial_cursor_++ % conns_.size()));
    out.notes.push_back({rdy_output::note_kind::trial, backoff_.level(), milliseconds(0), it->first});
    set_rdy(out, it->first, it->second, 1, now);
}

}  // namespace cg::nsq
