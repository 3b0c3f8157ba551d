// The simulator of a correction revision (docs/design.md §4a; docs/testing.md "The simulator"): each delivery
// of revision 1 of a charged period is the revision fsm that ships (billing/machine/revision_fsm.hpp, the
// machine billing::corrections drives), and this file runs its commands as billing/flow/corrections.cpp runs
// them: against a model of the corrections ledger (corrections_ledger.cpp: migration 0018's admit step and
// correction_ledger.cpp's statements), the move's create call with the revision's lease renewed beside it and
// the search by metadata (corrections_stripe.cpp), FIN and REQ. The models: nsqd (at-least-once, timeouts,
// duplicates), Stripe (refunds and extra charges under an idempotency cache, a 500 saved after the create,
// 429, connections that fail, stalls that run after the client gave up, list lag, refunds that fail at once),
// and crashes between any two steps. A removed safeguard is a model that misbehaves the way the code without
// it did, never a change to the fsm. Its own world and random stream, so the charge simulator's schedules
// (and the seeds docs/testing.md cites) are untouched.
#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "corrections_world.hpp"

namespace cg::sim {

namespace corrections_world {

namespace in = billing::machine::in;
using billing::machine::rop;

cworld::cworld(const config& c) : cfg_(c), rnd_{c.seed ^ 0x5eed0c0441ec7105ULL} {
    for (auto s : c.removed) removed_.push_back(s);
    fsm_cfg_ = fsm_config();
    res_.seed = c.seed;
}

billing::machine::flow_config cworld::fsm_config() const {
    billing::machine::flow_config f;
    f.key_namespace = "sim";
    f.lease = std::chrono::milliseconds(lease);
    f.lease_held_delay = std::chrono::milliseconds(sec);
    f.retry_same_key_delay = std::chrono::milliseconds(5 * sec);
    f.stripe_unavailable_delay = std::chrono::milliseconds(5 * sec);
    f.indeterminate_delay = std::chrono::milliseconds(30 * sec);
    // Without the quiet period the bump statement takes a new generation as soon as the search found nothing.
    f.new_key_quiet = std::chrono::milliseconds(has(safeguard::quiet_period) ? quiet : 0);
    f.same_key_window = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::milliseconds(window));
    return f;
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
        p.ev.customer_id = "cust-" + std::to_string(i);
        p.ev.billing_period = "2026-12";
        p.ev.amount_cents = p.total;
        p.ev.currency = "usd";
        p.ev.stripe_customer_id = "cus_" + std::to_string(i);
        p.ev.revision = 1;
        periods_.push_back(std::move(p));
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
    dlv d;
    d.m = m;
    d.token = tok;
    d.sc = sc;
    d.inc = sidecars_[sc].second;
    dlvs_.push_back(std::move(d));
    int id = static_cast<int>(dlvs_.size()) - 1;
    ++res_.deliveries;
    note("deliver m" + std::to_string(m) + " s" + std::to_string(sc));
    start(id);
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

// ---- the revision fsm's driver (billing::corrections) ----
void cworld::start(int id) {
    dlv& d = dlvs_[id];
    const int pi = msgs_[d.m].period;
    const period& p = periods_[pi];
    d.fsm.emplace(fsm_cfg_);
    exec(id, d.fsm->resume(in::revision{p.ev, p.base, move_key(pi), 1, rnd_.unit()}));
}

void cworld::resume(int id, const billing::machine::revision_input& i) {
    exec(id, dlvs_[id].fsm->resume(i));
}

// One command: a statement a few milliseconds later (the process may die before it), the search, the create
// call, or the verdict.
void cworld::exec(int id, billing::machine::revision_command c) {
    dlv& d = dlvs_[id];
    switch (c.what) {
        case rop::done:
            note("verdict " + std::string(billing::to_string(c.result.reason)));
            d.fsm.reset();
            if (c.result.finished()) return fin(d);
            return req(d, c.result.delay.count());
        case rop::create_charge:
        case rop::create_refund:
            return call(id, c);
        case rop::search_charge:
        case rop::search_refund:
            d.pending = std::move(c);
            return at(now_ + rnd_.range(50, 800), [this, id] {
                if (alive(id)) resume(id, search(id, dlvs_[id].pending));
            });
        default:
            d.pending = std::move(c);
            return at(now_ + pg(), [this, id] {
                if (alive(id)) resume(id, statement(id, dlvs_[id].pending));
            });
    }
}

// The move's create call as the fsm built it (its idempotency key, amount and metadata), with the revision's
// lease renewed beside it (corrections.cpp call).
void cworld::call(int id, const billing::machine::revision_command& c) {
    dlv& d = dlvs_[id];
    d.calling = true;
    int n = ++d.call;
    at(now_ + renew_every, [this, id, n] { renew_tick(id, n); });
    req_t q;
    q.d = id;
    q.call = n;
    const stripe::metadata* meta = &c.metadata;
    if (c.what == rop::create_refund) {
        q.idem = c.idempotency_key;
        q.refund = true;
        q.amount = c.amount_cents;
    } else {
        std::visit(
            [&](const auto& r) {
                q.idem = r.idempotency_key;
                q.amount = r.amount;
                meta = &r.metadata;
            },
            c.request);
        q.refund = false;
    }
    for (const auto& [k, v] : *meta)
        if (k == "billing_key") q.move_key = v;
    note("call " + q.idem);
    reqs_.push_back(std::move(q));
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

// One renewal while the call is awaited (billing::renew_once): the message touched, the revision's lease
// extended under the epoch the fsm holds — or, once it was taken over, the call noted in flight.
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
        // What the fsm asks for (billing::renew_once): renew_sql under its epoch, its result handed back;
        // once the lease was found taken over, in_flight_sql under its generation.
        revision_row& r = rev_of(d);
        move_row& m = *r.move;
        const auto what = d.fsm->renewal();
        if (!what.note_in_flight) {
            std::optional<std::int64_t> e;
            if (r.status == "pending" && r.epoch == what.epoch && m.status == "pending") {
                r.lease_until = now_ + lease;
                e = ++r.epoch;
                m.last_life = now_;
            }
            d.fsm->renewed(in::renewed{e});
        } else if (m.status == "pending" && m.gen == what.generation) {
            m.last_life = now_;
        }
    }
    at(now_ + renew_every, [this, id, c] { renew_tick(id, c); });
}

}  // namespace corrections_world

run_result run_corrections(const config& c) {
    return corrections_world::cworld(c).run();
}

}  // namespace cg::sim
