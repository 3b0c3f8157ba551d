// The simulator of a correction revision (docs/design.md §4a; docs/testing.md "The simulator"): sidecars run
// corrections.cpp's steps for revision 1 of charged periods — admit, record the attempt, call Stripe under
// the move's key while the lease is renewed, read the answer, search and take a new key generation — with
// the money machine deciding (billing::machine::on_refund_answer, on_move_answer, on_found), against models
// of the corrections ledger (migration 0018's admit step and correction_ledger.cpp's statements), nsqd
// (at-least-once, timeouts, duplicates) and Stripe (refunds and extra charges under an idempotency cache,
// a 500 saved after the create, 429, connections that fail, stalls that run after the client gave up,
// list lag, refunds that fail at once), and crashes between any two steps. Its own world and random
// stream, so the charge simulator's schedules (and the seeds docs/testing.md cites) are untouched.
#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "models.hpp"
#include "sim.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"

namespace cg::sim {
namespace {

using billing::machine::table;

struct move_row {
    std::string status = "pending";
    bool refund = true;
    std::int64_t amount = 0;
    std::int32_t gen = 1;
    ms_t first_attempt = -1;
    ms_t indeterminate_since = -1;
    ms_t last_life = -1;  // last_stripe_attempt_at
};

struct revision_row {
    std::string status = "waiting";
    ms_t lease_until = -1;
    std::int64_t epoch = 0;
    std::optional<move_row> move;
};

struct period {
    std::string base;
    std::string charge_id;  // the original charge, charged
    std::int64_t original = 0;
    std::int64_t total = 0;  // revision 1's total
    std::optional<revision_row> rev;
};

struct object {  // a refund or an extra charge at Stripe
    std::string id;
    std::string move_key;  // metadata[billing_key]
    bool refund = true;
    std::int64_t amount = 0;
    std::string status;
    ms_t visible_at = 0;  // listed from then on (list lag)
    int period = 0;
};

struct saved_answer {
    int http = 0;
    int obj = -1;
    ms_t at = 0;
};

struct msg {
    int period = 0;
    std::uint64_t token = 0;
    bool inflight = false;
    bool done = false;
    ms_t timeout_at = 0;
};

struct dlv {
    int m = 0;
    std::uint64_t token = 0;
    int sc = 0;
    std::uint64_t inc = 0;
    std::int64_t epoch = 0;
    std::int32_t gen = 1;
    int call = 0;
    bool calling = false;
};

struct req_t {
    int d = 0;
    int call = 0;
    std::string idem;
    int http = 0;  // 0: not executed (yet)
    int obj = -1;
};

struct act {
    ms_t at;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const act& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

constexpr ms_t lease = 60 * sec, renew_every = 15 * sec, msg_timeout = 60 * sec, client_timeout = 30 * sec;
constexpr ms_t quiet = 300 * sec, max_late = 240 * sec, idem_ttl = 24 * hour, window = 23 * hour;

class cworld {
  public:
    explicit cworld(const config& c) : cfg_(c), rnd_{c.seed ^ 0x5eed0c0441ec7105ULL} {
        for (auto s : c.removed) removed_.push_back(s);
        res_.seed = c.seed;
    }

    run_result run() {
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

  private:
    bool has(safeguard s) const { return std::find(removed_.begin(), removed_.end(), s) == removed_.end(); }
    void at(ms_t t, std::function<void()> fn) { q_.push({t, ++seq_, std::move(fn)}); }
    bool fault(double p) { return faults_ && rnd_.chance(p); }
    ms_t pg() { return rnd_.range(1, 20); }
    void note(const std::string& what) {
        for (unsigned char ch : what) digest_ = (digest_ ^ ch) * 0x100000001b3ULL;
        digest_ = (digest_ ^ static_cast<std::uint64_t>(now_)) * 0x100000001b3ULL;
        if (cfg_.trace) res_.schedule.push_back(std::to_string(now_) + " " + what);
    }
    void violation(const std::string& what) {
        note("VIOLATION " + what);
        if (res_.violations.size() < 20)
            res_.violations.push_back("t=" + std::to_string(now_) + "ms " + what);
    }
    std::string move_key(int p) const { return periods_[p].base + "-r1"; }

    // States move only along the money machine's table.
    void set_rev(revision_row& r, const std::string& to) {
        if (!billing::machine::allowed(table::revision, r.status, to))
            violation("state order: revision " + r.status + " -> " + to);
        r.status = to;
    }
    void set_move(move_row& m, const std::string& to) {
        if (!billing::machine::allowed(table::move, m.status, to))
            violation("state order: move " + m.status + " -> " + to);
        m.status = to;
    }

    // ---- nsqd ----
    void publish(int p) {
        msgs_.push_back({p});
        int m = static_cast<int>(msgs_.size()) - 1;
        at(now_ + rnd_.range(1, 100), [this, m] { deliver(m); });
    }
    void deliver(int m) {
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
    void timeout_check(int m, std::uint64_t tok) {
        msg& g = msgs_[m];
        if (!g.inflight || g.token != tok) return;
        if (now_ < g.timeout_at) return at(g.timeout_at, [this, m, tok] { timeout_check(m, tok); });
        g.inflight = false;
        at(now_ + rnd_.range(1, 100), [this, m] { deliver(m); });
    }
    bool owns(const dlv& d) const { return msgs_[d.m].inflight && msgs_[d.m].token == d.token; }
    void fin(const dlv& d) {
        if (owns(d)) {
            msgs_[d.m].inflight = false;
            msgs_[d.m].done = true;
        }
    }
    void req(const dlv& d, ms_t delay) {
        if (!owns(d)) return;
        msgs_[d.m].inflight = false;
        int m = d.m;
        at(now_ + delay, [this, m] { deliver(m); });
    }
    void touch(const dlv& d) {
        if (owns(d)) msgs_[d.m].timeout_at = now_ + msg_timeout;
    }

    // ---- the process ----
    bool alive(int id) {
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
    void admit(int id) {
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
    revision_row& rev_of(const dlv& d) { return *periods_[msgs_[d.m].period].rev; }
    void applied(int id) {
        dlv& d = dlvs_[id];
        revision_row& r = rev_of(d);
        if (r.status == "pending") {
            set_rev(r, "applied");
            r.lease_until = -1;
            ++r.epoch;
        }
        fin(d);
    }
    void release(const dlv& d) {
        revision_row& r = rev_of(d);
        if (r.status == "pending" && r.epoch == d.epoch) {
            r.lease_until = now_ - 1;
            ++r.epoch;
        }
    }
    void run_move(int id) {
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
    void attempt(int id) {
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
    void call(int id) {
        dlv& d = dlvs_[id];
        d.calling = true;
        int c = ++d.call;
        at(now_ + renew_every, [this, id, c] { renew_tick(id, c); });
        const std::string idem = billing::stripe_idempotency_key(move_key(msgs_[d.m].period), d.gen);
        note("call " + idem);
        reqs_.push_back({id, c, idem});
        int rq = static_cast<int>(reqs_.size()) - 1;
        if (fault(0.05))
            return at(now_ + rnd_.range(1, 100), [this, rq] { answered(rq, false); });  // not sent
        ms_t exec = now_ + (fault(0.1) ? rnd_.range(client_timeout / 2, max_late) : rnd_.range(5, 300));
        at(exec, [this, rq] { execute(rq); });
        ms_t back = exec + rnd_.range(5, 200);
        if (back - now_ > client_timeout)
            at(now_ + client_timeout, [this, rq] { answered(rq, true); });
        else
            at(back, [this, rq] { answered(rq, false); });
    }
    void renew_tick(int id, int c) {
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

    // ---- Stripe ----
    void execute(int rq) {
        req_t& q = reqs_[rq];
        auto it = saved_.find(q.idem);
        if (it != saved_.end() && now_ - it->second.at < idem_ttl) {
            q.http = it->second.http;
            q.obj = it->second.obj;
            return;
        }
        ++res_.stripe_creates;
        if (fault(0.05)) {
            q.http = 429;  // not saved
            return;
        }
        const dlv& d = dlvs_[q.d];
        const int pi = msgs_[d.m].period;
        const move_row& m = *periods_[pi].rev->move;
        object o;
        o.id = (m.refund ? "re_" : "ch_") + std::to_string(objects_.size());
        o.move_key = move_key(pi);
        o.refund = m.refund;
        o.amount = m.amount;
        o.status = !m.refund          ? "succeeded"
                   : fault(0.05)      ? "failed"
                   : rnd_.chance(0.1) ? "pending"
                                      : "succeeded";
        o.visible_at = now_ + rnd_.range(0, 30 * sec);
        o.period = pi;
        objects_.push_back(o);
        q.obj = static_cast<int>(objects_.size()) - 1;
        q.http = fault(0.08) ? 500 : 200;  // a 500 after the create: saved, replayed
        saved_[q.idem] = {q.http, q.obj, now_};
        note("stripe " + o.id + " " + o.status + " " + std::to_string(q.http));
        int moving = 0;
        for (const auto& x : objects_)
            if (x.move_key == o.move_key && x.status != "failed") ++moving;
        if (moving > 1) violation("two money moves for move key " + o.move_key);
    }
    void answered(int rq, bool timed_out) {
        req_t& q = reqs_[rq];
        dlv& d = dlvs_[q.d];
        if (d.call != q.call || !d.calling) return;
        if (!alive(q.d)) return;
        d.calling = false;
        stripe::outcome_class cls;
        if (timed_out)
            cls = stripe::classify_transport_failure(true);
        else if (q.http == 0)
            cls = stripe::classify_transport_failure(false);
        else {
            stripe::response_facts rf;
            rf.status = q.http;
            if (q.http == 500) rf.error_type = "api_error";
            if (q.http == 429) rf.error_type = "rate_limit_error";
            cls = stripe::classify_response(rf);
        }
        const move_row& m = *rev_of(d).move;
        const bool ok = !timed_out && q.http == 200;
        billing::machine::move_output o;
        if (m.refund) {
            o = billing::machine::on_refund_answer(cls, ok ? objects_[q.obj].status : std::string());
        } else {
            stripe::charge_outcome out;
            out.cls = cls;
            if (ok) out.charge_id = objects_[q.obj].id;
            o = billing::machine::on_move_answer(out);
        }
        note("answer " + std::string(billing::machine::to_string(o.command)));
        const int id = q.d;
        at(now_ + pg(), [this, id, o] {
            if (!alive(id)) return;
            dlv& d = dlvs_[id];
            move_row& m = *rev_of(d).move;
            switch (o.command) {
                case billing::machine::move_command::done:
                    if (m.status == "pending") {
                        set_move(m, "done");
                        m.indeterminate_since = -1;
                    }
                    return applied(id);
                case billing::machine::move_command::release:
                    release(d);
                    return req(d, 5 * sec);
                case billing::machine::move_command::indeterminate:
                    if (m.status == "pending" && m.indeterminate_since < 0) m.indeterminate_since = now_;
                    release(d);
                    return req(d, 30 * sec);
                default:
                    violation("an answer the simulated Stripe never gives: " +
                              std::string(billing::machine::to_string(o.command)));
                    return fin(d);
            }
        });
    }

    // The search by metadata[billing_key] (corrections.cpp search_move), read through the machine.
    void search(int id) {
        if (!alive(id)) return;
        dlv& d = dlvs_[id];
        const int pi = msgs_[d.m].period;
        const std::string key = move_key(pi);
        const object* found = nullptr;
        for (const auto& o : objects_)
            if (o.move_key == key && o.visible_at <= now_ && (!found || found->status == "failed"))
                found = &o;
        auto cmd = billing::machine::found_command::none;
        if (found && found->refund) {
            stripe::refund re;
            re.id = found->id;
            re.status = found->status;
            cmd = billing::machine::on_found(table::move, stripe::read(re));
        } else if (found) {
            stripe::charge ch;
            ch.id = found->id;
            ch.status = found->status;
            cmd = billing::machine::on_found(table::move, stripe::read(ch));
        }
        note("search " + key + " " + std::string(billing::machine::to_string(cmd)));
        move_row& m = *rev_of(d).move;
        switch (cmd) {
            case billing::machine::found_command::mark_charged:
                if (m.status == "pending") {
                    set_move(m, "done");
                    m.indeterminate_since = -1;
                }
                return at(now_ + pg(), [this, id] {
                    if (alive(id)) applied(id);
                });
            case billing::machine::found_command::none:
                return at(now_ + pg(), [this, id] { bump(id); });
            default:
                release(d);
                return req(d, 30 * sec);
        }
    }
    // bump_sql: a new key generation while we hold the lease, once no call under the old one showed life
    // for the quiet period.
    void bump(int id) {
        if (!alive(id)) return;
        dlv& d = dlvs_[id];
        revision_row& r = rev_of(d);
        move_row& m = *r.move;
        if (r.status != "pending" || r.epoch != d.epoch || m.status != "pending") return req(d, 5 * sec);
        if (has(safeguard::quiet_period) && m.last_life >= 0 && now_ - m.last_life < quiet) {
            release(d);
            return req(d, std::max<ms_t>(30 * sec, quiet / 10));
        }
        ++m.gen;
        m.indeterminate_since = -1;
        m.first_attempt = -1;
        note("bump " + move_key(msgs_[d.m].period) + " g" + std::to_string(m.gen));
        attempt(id);
    }

    void check_final() {
        for (std::size_t i = 0; i < periods_.size(); ++i) {
            const period& p = periods_[i];
            if (!p.rev || p.rev->status != "applied") {
                violation("revision of " + p.base + " not applied once the faults stopped: " +
                          (p.rev ? p.rev->status : std::string("absent")));
                continue;
            }
            std::int64_t net = p.original;
            for (const auto& o : objects_)
                if (o.period == static_cast<int>(i) && o.status != "failed")
                    net += o.refund ? -o.amount : o.amount;
            if (net != p.total)
                violation("Stripe holds " + std::to_string(net) + " for " + p.base + ", the revision says " +
                          std::to_string(p.total));
        }
        for (std::size_t m = 0; m < msgs_.size(); ++m)
            if (!msgs_[m].done) violation("message " + std::to_string(m) + " never finished");
    }

    config cfg_;
    rng rnd_;
    std::vector<safeguard> removed_;
    run_result res_;
    bool faults_ = true;
    ms_t now_ = 0;
    std::uint64_t seq_ = 0, tokens_ = 0;
    std::uint64_t digest_ = 0xcbf29ce484222325ULL;
    std::priority_queue<act, std::vector<act>, std::greater<>> q_;
    std::vector<std::pair<bool, std::uint64_t>> sidecars_;  // up, incarnation
    std::vector<period> periods_;
    std::vector<object> objects_;
    std::unordered_map<std::string, saved_answer> saved_;
    std::vector<msg> msgs_;
    std::vector<dlv> dlvs_;
    std::vector<req_t> reqs_;
};

}  // namespace

run_result run_corrections(const config& c) {
    return cworld(c).run();
}

}  // namespace cg::sim
