// The correction simulator's Stripe (corrections_world.hpp): the create under an idempotency cache, the
// answer read through the money machine, the search by metadata, the new key generation, the final checks.
#include "corrections_world.hpp"

namespace cg::sim::corrections_world {

// ---- Stripe ----
void cworld::execute(int rq) {
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
    o.status = !m.refund ? "succeeded" : fault(0.05) ? "failed" : rnd_.chance(0.1) ? "pending" : "succeeded";
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

void cworld::answered(int rq, bool timed_out) {
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
void cworld::search(int id) {
    if (!alive(id)) return;
    dlv& d = dlvs_[id];
    const int pi = msgs_[d.m].period;
    const std::string key = move_key(pi);
    const object* found = nullptr;
    for (const auto& o : objects_)
        if (o.move_key == key && o.visible_at <= now_ && (!found || found->status == "failed")) found = &o;
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
void cworld::bump(int id) {
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

void cworld::check_final() {
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

}  // namespace cg::sim::corrections_world
