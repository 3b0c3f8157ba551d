// The consumer's RDY/backoff controller, driven by event tables against a simulated nsqd view and clock:
// the controller's RDY commands are applied to per-connection histories, its timer requests fire when the
// simulated clock reaches them. The RDY budget is checked independently of the controller's own
// bookkeeping: a lowered RDY counts at its old value until settle_delay has passed (nsqd may not have
// applied it yet), and that sum must never exceed max_in_flight. Nor may what nsqd could have handed the
// consumer at once: nsqd sends on a connection while its in-flight count is below RDY, so a connection
// can hold max(RDY, deliveries not yet handled there), and a connection that dropped still holds its
// deliveries until their handlers finish.
//
// This header holds what the RDY controller's tests share (rdy_controller_test.cpp, rdy_backoff_test.cpp,
// rdy_deliveries_test.cpp): the settings, the simulated nsqd view and clock, and connection keys.
#pragma once

#include <boost/test/unit_test.hpp>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "nsq/rdy_controller.hpp"

using namespace cg::nsq;
using namespace std::chrono;
using note_kind = rdy_output::note_kind;

namespace {

inline rdy_settings settings(unsigned mif) {
    rdy_settings s;
    s.max_in_flight = mif;
    s.low_rdy_idle_timeout = seconds(10);
    s.settle_delay = milliseconds(100);
    s.redistribute_interval = seconds(5);
    s.backoff_multiplier = seconds(1);
    s.max_backoff = seconds(120);
    return s;
}

struct sim {
    explicit sim(unsigned mif) : s(settings(mif)), c(s) { take(c.start()); }

    rdy_settings s;
    rdy_controller c;
    clock::time_point now = clock::time_point{} + hours(1);
    std::map<rdy_timer, clock::time_point> due;
    struct sent {
        clock::time_point at;
        unsigned n;
    };
    std::map<std::string, std::vector<sent>> history;  // live connections only
    std::vector<rdy_output::note> notes;
    std::vector<rdy_output::rdy_command> last_rdy;  // of the last event
    std::uint64_t budget_violations = 0;
    std::uint64_t peak_effective = 0;
    // Deliveries received and not finished, oldest first, by connection ("" once it dropped).
    std::deque<std::string> deliveries;
    std::uint64_t outstanding_violations = 0;
    std::uint64_t peak_load = 0;

    unsigned rdy(const std::string& k) const {
        auto it = history.find(k);
        return it == history.end() || it->second.empty() ? 0 : it->second.back().n;
    }
    unsigned total() const {
        unsigned t = 0;
        for (const auto& [k, h] : history) t += h.empty() ? 0 : h.back().n;
        return t;
    }
    // What nsqd may be applying on `k`: the value in effect for sure (sent ≥ settle_delay ago) or anything
    // sent since, whichever is larger.
    unsigned effective(const std::string& k) const {
        unsigned before = 0, recent = 0;
        for (const auto& r : history.at(k)) {
            if (now - r.at >= s.settle_delay) {
                before = r.n;
            } else {
                recent = std::max(recent, r.n);
            }
        }
        return std::max(before, recent);
    }
    unsigned with_rdy() const {
        unsigned n = 0;
        for (const auto& [k, h] : history) n += !h.empty() && h.back().n > 0;
        return n;
    }
    std::uint64_t held(const std::string& k) const {
        return static_cast<std::uint64_t>(std::count(deliveries.begin(), deliveries.end(), k));
    }
    void check() {
        std::uint64_t eff = 0, load = held("");
        for (const auto& [k, h] : history) {
            eff += effective(k);
            load += std::max<std::uint64_t>(effective(k), held(k));
        }
        peak_effective = std::max(peak_effective, eff);
        if (eff > c.max_in_flight()) ++budget_violations;
        peak_load = std::max(peak_load, load);
        if (load > c.max_in_flight()) ++outstanding_violations;
    }
    void take(const rdy_output& o) {
        last_rdy = o.rdy;
        for (const auto& r : o.rdy) {
            BOOST_TEST_REQUIRE(history.contains(r.conn), "RDY for a connection that is not live: " << r.conn);
            history[r.conn].push_back({now, r.count});
        }
        for (const auto& t : o.timers) due[t.which] = now + t.after;
        notes.insert(notes.end(), o.notes.begin(), o.notes.end());
        check();
    }
    bool armed(rdy_timer t) const { return due.contains(t); }
    bool noted(note_kind k) const {
        for (const auto& n : notes)
            if (n.kind == k) return true;
        return false;
    }

    void add(const std::string& k, unsigned max_rdy = 2500) {
        history[k];
        take(c.connection_added(k, max_rdy, now));
    }
    void remove(const std::string& k) {
        history.erase(k);
        for (auto& d : deliveries)
            if (d == k) d.clear();
        take(c.connection_removed(k, now));
    }
    // A delivery arrives as nsqd would send it: only while the connection's in-flight count is below RDY.
    void receive(const std::string& k) {
        deliveries.push_back(k);
        c.message_received(k, now);
        check();
    }
    bool can_receive(const std::string& k) const { return held(k) < rdy(k); }
    // The oldest delivery's handler finishes.
    void finish(handler_signal sig) {
        BOOST_TEST_REQUIRE(!deliveries.empty());
        auto k = deliveries.front();
        deliveries.pop_front();
        take(c.handler_finished(k, sig, now));
    }
    bool finish_quietly(handler_signal sig) {
        BOOST_TEST_REQUIRE(!deliveries.empty());
        if (!c.finish_quietly(deliveries.front(), sig)) return false;
        deliveries.pop_front();
        check();
        return true;
    }
    // Moves the clock on, firing every timer that falls due on the way (in order).
    void advance(clock::duration d) {
        auto until = now + d;
        for (;;) {
            std::optional<std::pair<rdy_timer, clock::time_point>> next;
            for (const auto& [t, at] : due)
                if (at <= until && (!next || at < next->second)) next = {t, at};
            if (!next) break;
            due.erase(next->first);
            now = std::max(now, next->second);
            check();
            take(c.timer_fired(next->first, now));
        }
        now = until;
        check();
    }
};

inline std::string key(unsigned i) {
    return "10.0.0." + std::to_string(i) + ":4150";
}

}  // namespace
