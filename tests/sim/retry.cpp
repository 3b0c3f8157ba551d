// The operator's `retry-declined` (app/declined_retry.cpp, billing/store/retry_store.hpp, docs/design.md
// "Retrying a decline"): once the customer fixed the payment method, a declined row's open PaymentIntent is
// read through the fact and cancelled (one that succeeded meanwhile makes the row charged instead) — through
// the vault proxy when the schedule has one, which releases the intent's reservation once Stripe canceled it
// (forward_cancel) —, then the row is reopened under a new key generation with its old payments recorded, and
// the event is published again.
#include <functional>
#include <optional>
#include <string>

#include "stripe/fact.hpp"
#include "world.hpp"

namespace cg::sim::detail {

// `retry-declined --all` now and then, while a row the operator means to retry is not charged yet (a row the
// vault's cap blocked waits for a decision about the cap instead, not modelled).
void world::operator_run() {
    replay_letters();
    bool waiting = false;
    auto open = [](const row* r) {
        return !r || (r->rec.status != record_status::charged && r->rec.status != record_status::cap_blocked);
    };
    for (int i = 0; i < static_cast<int>(events_.size()); ++i) {
        if (!events_[i].retry) continue;
        const row* r = find_row(events_[i].key);
        if (r && r->rec.status == record_status::declined) {
            note("retry-declined " + r->rec.key);
            at(now_ + pg(), [this, i] { retry_look(i, 0); });
        }
        waiting = waiting || open(r);
    }
    for (const auto& e : events_) {
        const row* r = find_row(e.key);
        waiting = waiting || (e.replay && !e.replayed && open(r));
    }
    if (waiting && now_ < cfg_.fault_ms + p_.horizon)
        at(now_ + rnd_.range(2 * hour, 8 * hour), [this] { operator_run(); });
}

// The declined row's open intent, retrieved and read through the fact (two rounds, as
// app/declined_retry.cpp).
void world::retry_look(int event, int round) {
    const row* r = find_row(events_[event].key);
    if (!r || r->rec.status != record_status::declined) return;  // moved meanwhile
    if (!r->payment_intent_id || !has(safeguard::cancel_before_retry)) return reopen(event);
    if (fault(0.05)) return;  // the retrieve failed: not retried by this run
    int idx = -1;
    for (int i = 0; i < static_cast<int>(intents_.size()); ++i)
        if (intents_[i].id == *r->payment_intent_id) idx = i;
    if (idx < 0) return violation("row " + r->rec.key + " names an intent Stripe does not have");
    stripe::payment_intent p;
    p.id = intents_[idx].id;
    p.status = intents_[idx].status;
    if (intents_[idx].charge >= 0) p.latest_charge = charges_[intents_[idx].charge].id;
    switch (stripe::read(p).moved) {
        case stripe::movement::charged: {
            // charged_by_its_intent: the customer completed it; nothing is retried.
            row& w = *find_row(events_[event].key);
            commit(&w, w, false);
            set_status(w, record_status::charged);
            w.rec.charge_id = p.latest_charge;
            note("retry finds " + p.id + " succeeded: " + w.rec.key + " charged");
            return;
        }
        case stripe::movement::canceled:
            return reopen(event);
        case stripe::movement::failed:
        case stripe::movement::needs_customer:
        case stripe::movement::not_tried:
            break;
        default:
            return;  // money may still move: not retried
    }
    // Still open: cancel it, so it can never succeed beside the retry's payment. Stripe refuses to cancel
    // an intent that succeeded meanwhile: look again.
    at(now_ + rnd_.range(50, 2 * sec), [this, event, idx, round] {
        stripe_intent& pi = intents_[idx];
        const auto m = stripe::intent_movement(pi.status);
        if (m == stripe::movement::failed || m == stripe::movement::needs_customer ||
            m == stripe::movement::not_tried) {
            pi.status = "canceled";
            note("cancel " + pi.id);
            vault_cancel(idx);
            emit_intent_webhook(idx);
            at(now_ + pg(), [this, event] { reopen(event); });
        } else if (round == 0) {
            retry_look(event, 1);
        }
    });
}

void world::supersede_payments(const row& r) {
    if (r.rec.charge_id) retried_payments_.insert(*r.rec.charge_id);
    if (r.payment_intent_id) retried_payments_.insert(*r.payment_intent_id);
}

// retry_store's reopen: pending, key_generation + 1, no lease, the attempt window restarted, the old
// payment's ids cleared and recorded (the recovery search skips them); then the event is published again.
void world::reopen(int event) {
    event_spec& e = events_[event];
    row* r = find_row(e.key);
    if (!r || r->rec.status != record_status::declined) return;
    supersede_payments(*r);
    commit(r, *r, false);
    set_status(*r, record_status::pending);
    ++r->rec.key_generation;
    r->rec.charge_id.reset();
    r->payment_intent_id.reset();
    r->indeterminate_since = -1;
    r->first_attempt = now_;
    r->last_life = now_;
    r->lease_until = -1;
    ++r->epoch;
    e.fixed = true;
    note("reopen " + e.key + " g" + std::to_string(r->rec.key_generation));
    publish(event);
}

}  // namespace cg::sim::detail
