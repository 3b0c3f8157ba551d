// The correction simulator's Stripe (corrections_world.hpp): the create under an idempotency cache, its
// answer and the search by metadata handed to the revision fsm as billing::corrections hands them, the final
// checks.
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
    object o;
    o.id = (q.refund ? "re_" : "ch_") + std::to_string(objects_.size());
    o.move_key = q.move_key;
    o.refund = q.refund;
    o.amount = q.amount;
    o.status = !q.refund ? "succeeded" : fault(0.05) ? "failed" : rnd_.chance(0.1) ? "pending" : "succeeded";
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
    const bool ok = !timed_out && q.http == 200;
    note("answer " + std::to_string(timed_out ? 0 : q.http));
    const int id = q.d;
    if (q.refund) {
        billing::machine::in::refund_answer a;
        a.cls = cls;
        if (ok) {
            stripe::refund re;
            re.id = objects_[q.obj].id;
            re.status = objects_[q.obj].status;
            re.amount = objects_[q.obj].amount;
            a.refund = std::move(re);
        }
        return resume(id, a);
    }
    billing::machine::in::answer a;
    a.out.cls = cls;
    a.out.http_status = timed_out ? 0 : q.http;
    if (ok) a.out.charge_id = objects_[q.obj].id;
    resume(id, a);
}

// The search by metadata[billing_key] (find_charge_by_metadata, find_refund_by_metadata): a refund or charge
// that moved money if one is listed yet, else a failed one. Without search_before_new_key the lists show
// nothing, as the code that went straight to a new key generation saw.
billing::machine::revision_input cworld::search(int id, const billing::machine::revision_command& c) {
    const int pi = msgs_[dlvs_[id].m].period;
    const object* found = nullptr;
    if (has(safeguard::search_before_new_key))
        for (const auto& o : objects_)
            if (o.period == pi && o.move_key == c.move_key && o.visible_at <= now_ &&
                (!found || found->status == "failed"))
                found = &o;
    note("search " + c.move_key + " " + (found ? found->id + " " + found->status : std::string("nothing")));
    if (c.what == billing::machine::rop::search_refund) {
        billing::machine::in::refund_found r;
        if (found && found->refund) {
            stripe::refund re;
            re.id = found->id;
            re.status = found->status;
            re.amount = found->amount;
            re.charge = periods_[pi].charge_id;
            r.found = std::move(re);
        }
        return r;
    }
    billing::machine::in::charge_found f;
    if (found && !found->refund) {
        stripe::charge ch;
        ch.id = found->id;
        ch.status = found->status;
        f.found = std::move(ch);
    }
    return f;
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
