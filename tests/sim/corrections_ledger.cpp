// The correction simulator's corrections ledger (corrections_world.hpp): the revision fsm's statements with
// the semantics of migration 0018's cg_correction_admit and correction_ledger.cpp's statements, on one
// revision row and its move per period.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "corrections_world.hpp"

namespace cg::sim::corrections_world {

namespace in = billing::machine::in;
using billing::machine::rop;

// ---- the corrections ledger's statements ----
// The statements as correction_ledger.cpp writes them: each changes a row only while the revision is pending
// (and, where it names one, under the epoch of the lease it holds).
billing::machine::revision_input cworld::statement(int id, const billing::machine::revision_command& c) {
    dlv& d = dlvs_[id];
    note(std::string(billing::machine::to_string(c.what)) + " " + move_key(msgs_[d.m].period) + " e" +
         std::to_string(c.epoch));
    if (c.what == rop::admit) return admit(id);
    revision_row& r = rev_of(d);
    move_row& m = *r.move;
    const bool ours = r.status == "pending" && r.epoch == c.epoch;
    switch (c.what) {
        case rop::moves:
            return in::moves{moves(d), at_ms(now_)};
        case rop::record_attempt:  // attempt_sql
            if (!ours || m.status != "pending") return in::leased{};
            r.lease_until = now_ + lease;
            ++r.epoch;
            if (m.first_attempt < 0) m.first_attempt = now_;
            m.last_life = now_;
            return in::leased{r.epoch};
        case rop::move_done:  // done_sql
            if (m.status == "pending") {
                set_move(m, "done");
                m.object_id = c.object_id;
                m.indeterminate_since = -1;
            }
            return in::applied{};
        case rop::move_ended:  // ended_sql
            if (m.status == "pending") set_move(m, c.status);
            return in::applied{};
        case rop::move_indeterminate:  // indeterminate_sql
            if (m.status == "pending" && m.indeterminate_since < 0) m.indeterminate_since = now_;
            release(r, c.epoch);
            return in::applied{};
        case rop::release:  // release_sql
            release(r, c.epoch);
            return in::applied{};
        case rop::bump_generation: {  // bump_sql: under the lease, once no call under the old key showed life
            const ms_t q = fsm_cfg_.new_key_quiet.count();
            if (!ours || m.status != "pending" || m.gen != c.generation ||
                (m.last_life >= 0 && now_ - m.last_life <= q && q > 0))
                return in::bumped{};
            ++m.gen;
            m.indeterminate_since = -1;
            m.first_attempt = -1;
            note("bump g" + std::to_string(m.gen));
            return in::bumped{m.gen};
        }
        case rop::finish:  // finish_sql
            if (r.status == "pending") {
                set_rev(r, c.status);
                r.lease_until = -1;
                ++r.epoch;
            }
            return in::applied{};
        case rop::dead_letter:
            violation("a valid correction was dead-lettered: " + c.text);
            return in::applied{true};
        default:
            violation("not a ledger statement: " + std::string(billing::machine::to_string(c.what)));
            return in::applied{};
    }
}

// cg_correction_admit for a period whose original is charged: the revision and its move written on the first
// delivery, then the lease taken when it is free.
billing::machine::revision_input cworld::admit(int id) {
    dlv& d = dlvs_[id];
    period& p = periods_[msgs_[d.m].period];
    if (!p.rev) p.rev = revision_row{};
    revision_row& r = *p.rev;
    in::admitted a;
    a.delta = p.total - p.original;
    if (r.status != "waiting" && r.status != "pending") {
        a.action = "final";
        a.detail = r.status;
        return a;
    }
    if (r.status == "pending" && r.lease_until >= now_) {
        a.action = "lease_held";
        a.detail = "lease held";
        a.lease_remaining = std::chrono::milliseconds(r.lease_until - now_);
        return a;
    }
    if (r.status == "waiting") {
        move_row m;
        m.refund = p.total < p.original;
        m.amount = m.refund ? p.original - p.total : p.total - p.original;
        r.move = m;
        set_rev(r, "pending");
    }
    r.lease_until = now_ + lease;
    a.epoch = ++r.epoch;
    a.action = "run";
    return a;
}

std::vector<billing::machine::move_view> cworld::moves(const dlv& d) const {
    const int pi = msgs_[d.m].period;
    const period& p = periods_[pi];
    const move_row& m = *p.rev->move;
    billing::machine::move_view v;
    v.refund = m.refund;
    v.amount_cents = m.amount;
    if (m.refund) v.refund_of = p.charge_id;
    v.key_generation = m.gen;
    v.status = m.status;
    v.stripe_object_id = m.object_id;
    if (m.first_attempt >= 0) v.first_stripe_attempt_at = at_ms(m.first_attempt);
    if (m.indeterminate_since >= 0) v.indeterminate_since = at_ms(m.indeterminate_since);
    v.key = move_key(pi);
    return {v};
}

// A released lease is set just in the past: expired for the next admit.
void cworld::release(revision_row& r, std::int64_t epoch) {
    if (r.status == "pending" && r.epoch == epoch) {
        r.lease_until = now_ - 1;
        ++r.epoch;
    }
}

}  // namespace cg::sim::corrections_world
