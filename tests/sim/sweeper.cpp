// PostgreSQL's failover and the healers that make up for it (docs/testing.md "The simulator"):
//   * a failover promotes an asynchronous standby that lacks the primary's last commits: the ledger loses
//     its last few committed statements (a settle, a lease, an attempt…), whatever messages were FINed on
//     their strength;
//   * the sweeper of each sidecar (billing/heal/sweeper.hpp) takes up the pending rows no message brings
//     back: every sweep interval, the unleased pending rows inactive for the sweep bound (or with a webhook's
//     fact waiting); after a failover, from its grace and every failover interval within its window, the
//     pending rows last written before it, a lease still on one ended first (under the epoch the sweep read,
//     if nothing wrote the row since: sweep_sql.cpp end_stale_lease). Each row runs through the charge fsm
//     that ships, started with in::swept as charge_flow::resume starts it: the lease take, then RECOVER;
//   * the operator's dead-letter replay (app/dead_letter_replay.cpp) of a debit that failed after
//     processing, once the customer's account was fixed: machine::on_replay decides, the ledger's
//     reopen_for_replay statement (ledger_sql.hpp reopen_sql) reopens, the event is published again.
#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/machine.hpp"
#include "world.hpp"

namespace cg::sim::detail {

namespace in = billing::machine::in;

int world::event_of(const std::string& key) const {
    for (int i = 0; i < static_cast<int>(events_.size()); ++i)
        if (events_[i].key == key) return i;
    return -1;
}

// The standby promoted lacks the last commits: one to lost_commits of them, none older than the
// replication lag.
void world::failover() {
    if (!faults_ || !kept_fault()) return;
    const int lost = static_cast<int>(rnd_.range(1, p_.lost_commits));
    int undone = 0;
    for (; undone < lost && !journal_.empty() && journal_.back().at >= now_ - p_.replication_lag; ++undone) {
        rows_[journal_.back().key] = std::move(journal_.back().before);
        journal_.pop_back();
    }
    journal_.clear();
    result_.lost_commits += static_cast<std::uint64_t>(undone);
    note("failover: " + std::to_string(undone) + " commit(s) lost");
    // Each running sidecar's pool sees the failover (pg::pool::on_failover) and its sweeper sweeps soon.
    for (int sc = 0; sc < static_cast<int>(sidecars_.size()); ++sc) {
        if (!sidecars_[sc].up) continue;
        const ms_t f = now_;
        at(f + p_.failover_grace, [this, sc, inc = sidecars_[sc].incarnation, f] {
            failover_sweeps(sc, inc, f, f + p_.failover_window);
        });
    }
}

void world::failover_sweeps(int sc, std::uint64_t incarnation, ms_t failed_over, ms_t until) {
    // A sidecar restarted since has forgotten the failover: its regular sweeps remain.
    if (now_ >= until || !sidecars_[sc].up || sidecars_[sc].incarnation != incarnation) return;
    if (has(safeguard::sweeper)) sweep(sc, failed_over);
    at(now_ + p_.failover_every,
       [this, sc, incarnation, failed_over, until] { failover_sweeps(sc, incarnation, failed_over, until); });
}

// The regular sweep. The simulator skips the ticks that could find nothing (no pending row, or none
// inactive for the bound yet): it wakes at the first tick a row could be due.
void world::sweep_tick(int sc) {
    --sweep_ticks_;
    if (now_ >= cfg_.fault_ms + p_.horizon) return;
    if (sidecars_[sc].up && has(safeguard::sweeper)) sweep(sc, -1);
    ms_t due = std::numeric_limits<ms_t>::max();
    for (const auto& [k, r] : rows_) {
        if (!r.pending()) continue;
        ms_t active = std::max(r.updated, r.lease_until);
        due = std::min(due, stashed_.count(k) ? now_ : active + p_.sweep_after);
    }
    ms_t next = now_ + p_.sweep_every;
    if (due == std::numeric_limits<ms_t>::max()) {
        // No pending row: one can only appear by a delivery, a failover or the operator; once nothing else
        // is scheduled, none will.
        if (queue_.size() <= static_cast<std::size_t>(sweep_ticks_)) return;
        next = now_ + 30 * minute;
    } else if (due > next) {
        next += (due - next + p_.sweep_every - 1) / p_.sweep_every * p_.sweep_every;
    }
    ++sweep_ticks_;
    at(next, [this, sc] { sweep_tick(sc); });
}

// One sweep (sweep_sql.cpp's abandoned_rows, or failed_over_rows when `written_before` is the failover's
// time): the unleased pending rows — after a failover also the leased ones last written before it, whose
// lease is ended first — each run as a delivery of the sweeper's.
void world::sweep(int sc, ms_t written_before) {
    for (const auto& [k, r] : rows_) {
        const bool leased = r.lease_until >= now_;
        if (!r.pending() || (leased && written_before < 0)) continue;
        const bool found = written_before >= 0 ? r.updated < written_before
                                               : std::max(r.updated, r.lease_until) < now_ - p_.sweep_after ||
                                                     stashed_.count(k);
        if (!found) continue;
        if (!leased) {
            sweep_row(sc, k, written_before >= 0);
            continue;
        }
        // end_stale_lease: a statement of its own, after the read, under the epoch read and only if nothing
        // wrote the row since the failover.
        at(now_ + pg(), [this, sc, key = k, epoch = r.epoch, written_before] {
            row* now_row = find_row(key);
            if (!now_row || !now_row->pending() || now_row->epoch != epoch ||
                now_row->updated >= written_before)
                return;
            commit(now_row, *now_row);
            now_row->lease_until = now_ - 1;
            ++now_row->epoch;
            ++result_.leases_ended;
            note("sweep s" + std::to_string(sc) + " " + key + ": lease unwritten since the failover ended");
            sweep_row(sc, key, true);
        });
    }
}

// The sweeper runs one row it found as a delivery of its own.
void world::sweep_row(int sc, const std::string& k, bool after_failover) {
    delivery d;
    d.msg = -1;
    d.swept = true;
    d.sidecar = sc;
    d.incarnation = sidecars_[sc].incarnation;
    d.key = k;
    deliveries_.push_back(std::move(d));
    const int id = static_cast<int>(deliveries_.size()) - 1;
    ++result_.swept;
    note("sweep s" + std::to_string(sc) + " " + k + (after_failover ? " (failover)" : ""));
    at(now_ + pg(), [this, id] { start_swept(id); });
}

// charge_flow::resume: the row as the sweep read it, its event from the row's fields.
void world::start_swept(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    const row* r = find_row(d.key);
    const int e = event_of(d.key);
    if (!r || e < 0) return violation("the sweeper found a row of no event: " + d.key);
    d.ev = events_[e].ev;
    d.fsm.emplace(fsm_cfg_);
    exec(id, d.fsm->resume(in::swept{d.ev, r->view(now_), 1, at_ms(now_), rnd_.unit()}));
}

// `dead-letters replay` of the letters of debits that failed after processing, once their customers fixed
// their accounts.
void world::replay_letters() {
    for (int i = 0; i < static_cast<int>(events_.size()); ++i) {
        event_spec& e = events_[i];
        row* r = find_row(e.key);
        if (!e.replay || e.replayed || !r || r->rec.status != record_status::failed_after_processing)
            continue;
        e.replayed = true;
        e.fixed = true;
        ++result_.replays;
        const auto what = billing::machine::on_replay(r->rec.status);
        note("replay letter " + e.key + ": " + std::string(billing::machine::to_string(what)));
        if (what != billing::machine::replay_command::reopen_then_publish) continue;
        // reopen_sql from failed_after_processing: pending under a new key generation, the failed payment's
        // ids moved to billing_retries, the attempt window restarted, no lease.
        if (has(safeguard::replay_new_generation)) supersede_payments(*r);
        commit(r, *r, false);
        set_status(*r, record_status::pending);
        if (has(safeguard::replay_new_generation)) ++r->rec.key_generation;
        r->indeterminate_since = -1;
        r->rec.charge_id.reset();
        r->payment_intent_id.reset();
        r->first_attempt = now_;
        r->lease_until = -1;
        ++r->epoch;
        publish(i);
    }
}

}  // namespace cg::sim::detail
