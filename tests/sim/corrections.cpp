// The simulator of a correction revision (docs/design.md §4a; docs/testing.md "The simulator"): sidecars run
// corrections.cpp's steps for revision 1 of charged periods — admit, record the attempt, call Stripe under
// the move's key while the lease is renewed, read the answer, search and take a new key generation — with
// the money machine deciding (billing::machine::on_refund_answer, on_move_answer, on_found), against models
// of the corrections ledger (migration 0018's admit step and correction_ledger.cpp's statements), nsqd
// (at-least-once, timeouts, duplicates) and Stripe (refunds and extra charges under an idempotency cache,
// a 500 saved after the create, 429, connections that fail, stalls that run after the client gave up,
// list lag, refunds that fail at once), and crashes between any two steps. Its own world and random
// stream, so the charge simulator's schedules (and the seeds docs/testing.md cites) are untouched.
#include "corrections_world.hpp"

namespace cg::sim {

namespace corrections_world {

cworld::cworld(const config& c) : cfg_(c), rnd_{c.seed ^ 0x5eed0c0441ec7105ULL} {
    for (auto s : c.removed) removed_.push_back(s);
    res_.seed = c.seed;
}

run_result cworld::run() {
    const int n = std::max(2, cfg_.events / 2);
    for (int i = 0; i < 3; ++i) sidecars_.push_back({true, 0});
    for (int i = 0; i < n; ++i) {
        period p;
        p.base = billing::base_key("sim", "cust-" + std::to_string(i), "2026-12", "");
        p.charge_id = "ch_orig_" + std::to_string(i);
        p.original = rnd_.range(1000, 9999);
        // A partial refund, or (one in four) an extra charge.
        p.total = rnd_.chance(0.25) ? p.original + rnd_.range(1, 5000) : rnd_.range(0, p.original - 1);
        periods_.push_back(p);
        const int copies = rnd_.chance(0.5) ? 2 : 1;  // published twice
        for (int k = 0; k < copies; ++k) at(rnd_.range(0, hour), [this, i] { publish(i); });
    }
    const ms_t faults_end = cfg_.fault_ms / 3;
    at(faults_end, [this] { faults_ = false; });
    const ms_t horizon = faults_end + 2 * 24 * hour;
    while (!q_.empty() && res_.violations.size() < 5) {
        auto a = q_.top();
        q_.pop();
        if (a.at > horizon) break;
        now_ = a.at;
        ++res_.steps;
        a.fn();
    }
    check_final();
    res_.digest = digest_;
    return std::move(res_);
}

// ---- nsqd ----
void cworld::publish(int p) {
    msgs_.push_back({p});
    int m = static_cast<int>(msgs_.size()) - 1;
    at(now_ + rnd_.range(1, 100), [this, m] { deliver(m); });
}

void cworld::deliver(int m) {
    msg& g = msgs_[m];
    if (g.done || g.inflight) return;
    std::vector<int> up;
    for (int i = 0; i < static_cast<int>(sidecars_.size()); ++i)
        if (sidecars_[i].first) up.push_back(i);
    if (up.empty()) return at(now_ + sec, [this, m] { deliver(m); });
    g.inflight = true;
    g.token = ++tokens_;
    g.timeout_at = now_ + msg_timeout;
    std::uint64_t tok = g.token;
    at(g.timeout_at, [this, m, tok] { timeout_check(m, tok); });
    int sc = up[static_cast<std::size_t>(rnd_.range(0, static_cast<ms_t>(up.size()) - 1))];
    dlvs_.push_back({m, tok, sc, sidecars_[sc].second});
    int id = static_cast<int>(dlvs_.size()) - 1;
    ++res_.deliveries;
    note("deliver m" + std::to_string(m) + " s" + std::to_string(sc));
    at(now_ + pg(), [this, id] { admit(id); });
}

void cworld::timeout_check(int m, std::uint64_t tok) {
    msg& g = msgs_[m];
    if (!g.inflight || g.token != tok) return;
    if (now_ < g.timeout_at) return at(g.timeout_at, [this, m, tok] { timeout_check(m, tok); });
    g.inflight = false;
    at(now_ + rnd_.range(1, 100), [this, m] { deliver(m); });
}

void cworld::fin(const dlv& d) {
    if (owns(d)) {
        msgs_[d.m].inflight = false;
        msgs_[d.m].done = true;
    }
}

void cworld::req(const dlv& d, ms_t delay) {
    if (!owns(d)) return;
    msgs_[d.m].inflight = false;
    int m = d.m;
    at(now_ + delay, [this, m] { deliver(m); });
}

void cworld::touch(const dlv& d) {
    if (owns(d)) msgs_[d.m].timeout_at = now_ + msg_timeout;
}

// ---- the process ----
bool cworld::alive(int id) {
    const dlv& d = dlvs_[id];
    auto& s = sidecars_[d.sc];
    if (!s.first || s.second != d.inc) return false;
    if (fault(0.03)) {
        note("crash s" + std::to_string(d.sc));
        s.first = false;
        ++s.second;
        int sc = d.sc;
        at(now_ + rnd_.range(sec, 60 * sec), [this, sc] { sidecars_[sc].first = true; });
        return false;
    }
    return true;
}

// ---- corrections.cpp's steps ----
// cg_correction_admit for a period whose original is charged.
void cworld::admit(int id) {
    if (!alive(id)) return;
    dlv& d = dlvs_[id];
    period& p = periods_[msgs_[d.m].period];
    if (!p.rev) p.rev = revision_row{};
    revision_row& r = *p.rev;
    if (r.status != "waiting" && r.status != "pending") return fin(d);  // final: a duplicate
    if (r.status == "pending" && r.lease_until >= now_)
        return req(d, r.lease_until - now_ + rnd_.range(0, sec));
    if (r.status == "waiting") {
        move_row m;
        m.refund = p.total < p.original;
        m.amount = m.refund ? p.original - p.total : p.total - p.original;
        r.move = m;
        set_rev(r, "pending");
    }
    r.lease_until = now_ + lease;
    d.epoch = ++r.epoch;
    note("admit " + move_key(msgs_[d.m].period) + " epoch " + std::to_string(d.epoch));
    run_move(id);
}

void cworld::applied(int id) {
    dlv& d = dlvs_[id];
    revision_row& r = rev_of(d);
    if (r.status == "pending") {
        set_rev(r, "applied");
        r.lease_until = -1;
        ++r.epoch;
    }
    fin(d);
}

void cworld::release(const dlv& d) {
    revision_row& r = rev_of(d);
    if (r.status == "pending" && r.epoch == d.epoch) {
        r.lease_until = now_ - 1;
        ++r.epoch;
    }
}

void cworld::run_move(int id) {
    dlv& d = dlvs_[id];
    move_row& m = *rev_of(d).move;
    if (m.status == "done")
        return at(now_ + pg(), [this, id] {
            if (alive(id)) applied(id);
        });
    bool trusted = m.indeterminate_since < 0 && (m.first_attempt < 0 || now_ - m.first_attempt < window);
    if (trusted) return at(now_ + pg(), [this, id] { attempt(id); });
    if (has(safeguard::search_before_new_key))
        return at(now_ + rnd_.range(50, 800), [this, id] { search(id); });
    at(now_ + pg(), [this, id] { bump(id); });
}

void cworld::attempt(int id) {
    if (!alive(id)) return;
    dlv& d = dlvs_[id];
    revision_row& r = rev_of(d);
    move_row& m = *r.move;
    if (r.status != "pending" || r.epoch != d.epoch || m.status != "pending") return req(d, 5 * sec);
    r.lease_until = now_ + lease;
    d.epoch = ++r.epoch;
    if (m.first_attempt < 0) m.first_attempt = now_;
    m.last_life = now_;
    d.gen = m.gen;
    call(id);
}

void cworld::call(int id) {
    dlv& d = dlvs_[id];
    d.calling = true;
    int c = ++d.call;
    at(now_ + renew_every, [this, id, c] { renew_tick(id, c); });
    const std::string idem = billing::stripe_idempotency_key(move_key(msgs_[d.m].period), d.gen);
    note("call " + idem);
    reqs_.push_back({id, c, idem});
    int rq = static_cast<int>(reqs_.size()) - 1;
    if (fault(0.05)) return at(now_ + rnd_.range(1, 100), [this, rq] { answered(rq, false); });  // not sent
    ms_t exec = now_ + (fault(0.1) ? rnd_.range(client_timeout / 2, max_late) : rnd_.range(5, 300));
    at(exec, [this, rq] { execute(rq); });
    ms_t back = exec + rnd_.range(5, 200);
    if (back - now_ > client_timeout)
        at(now_ + client_timeout, [this, rq] { answered(rq, true); });
    else
        at(back, [this, rq] { answered(rq, false); });
}

void cworld::renew_tick(int id, int c) {
    dlv& d = dlvs_[id];
    if (d.call != c || !d.calling) return;
    if (!sidecars_[d.sc].first || sidecars_[d.sc].second != d.inc) return;
    touch(d);
    if (fault(0.05) && owns(d)) {
        // The connection to nsqd dropped: the message goes to another sidecar while this one carries on.
        msgs_[d.m].inflight = false;
        int m = d.m;
        at(now_ + rnd_.range(1, 500), [this, m] { deliver(m); });
    }
    if (has(safeguard::lease_renewal)) {
        revision_row& r = rev_of(d);
        move_row& m = *r.move;
        if (r.status == "pending" && r.epoch == d.epoch && m.status == "pending") {
            r.lease_until = now_ + lease;
            d.epoch = ++r.epoch;
            m.last_life = now_;
        } else if (m.status == "pending" && m.gen == d.gen) {
            m.last_life = now_;  // noted in flight
        }
    }
    at(now_ + renew_every, [this, id, c] { renew_tick(id, c); });
}

}  // namespace corrections_world

run_result run_corrections(const config& c) {
    return corrections_world::cworld(c).run();
}

}  // namespace cg::sim
