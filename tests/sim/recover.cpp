// RECOVER's steps (billing/flow/recovery.cpp, docs/design.md §4): the search by metadata, read through the
// fact and the money machine (billing::machine::on_found, step_for_found_intent), and a new key generation
// once the quiet period has passed.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "billing/machine/machine.hpp"
#include "billing/machine/outcome.hpp"
#include "stripe/fact.hpp"
#include "world.hpp"

namespace cg::sim::detail {

// RECOVER's search: the customer's charges carrying the key in metadata (recovery.cpp found_charge: the
// fact says what the charge did).
void world::search(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    if (fault(0.02)) {  // the list failed
        release(d.key, d.epoch);
        return req(d, p_.indeterminate_delay);
    }
    const row& r = *find_row(d.key);
    const stripe_charge* found = nullptr;
    for (auto it = charges_.rbegin(); it != charges_.rend(); ++it) {  // newest first, as Stripe lists
        const auto& c = *it;
        if (c.billing_key != d.key || c.visible_at > now_ || c.created < r.first_attempt - 24 * hour ||
            retried_payments_.count(c.id))
            continue;
        if (!found || (found->status == "failed" && c.status != "failed")) found = &c;
    }
    if (found && found->status == "failed" && found->created < r.first_attempt - 300 * sec) found = nullptr;
    if (!found && d.ev.uses_payment_intent()) return search_intents(id);
    if (!found) {
        note("search " + d.key + " none");
        at(now_ + pg(), [this, id] { bump(id); });
        return;
    }
    stripe::charge sc;
    sc.id = found->id;
    sc.status = found->status;
    sc.payment_method_type = found->payment_method_type;
    auto f = stripe::read(sc);
    note("search " + d.key + " found " + sc.id + " " + std::string(stripe::to_string(f.moved)));
    // The money machine's reading (recovery.cpp found_charge); a removed safeguard restores the reading
    // from before it.
    using fc = billing::machine::found_command;
    auto cmd = billing::machine::on_found(billing::machine::table::charge, f);
    const bool debit_failed = f.moved == stripe::movement::failed && f.bank_debit;
    if (debit_failed && !has(safeguard::failed_debit_processing)) cmd = fc::mark_declined;
    if (cmd == fc::mark_processing && !debit_failed && !has(safeguard::in_flight_not_charged))
        cmd = fc::mark_charged;
    record_status s = record_status::charged;
    switch (cmd) {
        case fc::mark_processing:
            s = record_status::processing;
            break;
        case fc::mark_declined:
            s = record_status::declined;
            break;
        case fc::mark_charged:
            s = record_status::charged;
            break;
        case fc::still_open:
        case fc::none:
            return req(d, p_.indeterminate_delay);
    }
    std::string ch = sc.id;
    at(now_ + pg(), [this, id, s, ch] {
        if (!alive(id)) return;
        delivery& d = deliveries_[id];
        settle(d.key, s, ch);
        fin(d);
    });
}

// Then, for an event charged through a PaymentIntent, the customer's PaymentIntents carrying the key
// (recovery.cpp found_intent: billing::step_for_found_intent decides).
void world::search_intents(int id) {
    delivery& d = deliveries_[id];
    const row& r = *find_row(d.key);
    const stripe_intent* found = nullptr;
    for (auto it = intents_.rbegin(); it != intents_.rend() && !found; ++it)
        if (it->billing_key == d.key && it->visible_at <= now_ &&
            it->created >= r.first_attempt - 24 * hour && !retried_payments_.count(it->id))
            found = &*it;
    stripe::payment_intent p;
    if (found) {
        p.id = found->id;
        p.status = found->status;
        // Without the safeguard the intent is read as its status alone: a failed debit looks declined.
        if (has(safeguard::failed_debit_processing)) p.payment_method_type = found->failed_method;
        if (found->charge >= 0) p.latest_charge = charges_[found->charge].id;
    }
    auto step = found ? billing::step_for_found_intent(p) : billing::found_intent_step::not_charged;
    if (found && step == billing::found_intent_step::mark_declined &&
        found->created < r.first_attempt - 300 * sec)
        step = billing::found_intent_step::not_charged;  // a failure from an earlier life of the key
    if (step == billing::found_intent_step::not_charged && found && !has(safeguard::not_tried_not_declined))
        step = billing::found_intent_step::mark_declined;  // the reading create used to have
    if (step == billing::found_intent_step::mark_processing && !has(safeguard::in_flight_not_charged))
        step = billing::found_intent_step::mark_charged;
    note("search intents " + d.key + " " + (found ? p.id + " " + p.status : std::string("none")));
    record_status s = record_status::charged;
    switch (step) {
        case billing::found_intent_step::not_charged:
            at(now_ + pg(), [this, id] { bump(id); });
            return;
        case billing::found_intent_step::still_open:
            release(d.key, d.epoch);
            return req(d, p_.indeterminate_delay);
        case billing::found_intent_step::mark_charged:
            s = record_status::charged;
            break;
        case billing::found_intent_step::mark_declined:
            s = record_status::declined;
            break;
        case billing::found_intent_step::mark_processing:
            s = record_status::processing;
            break;
    }
    std::string ch = p.latest_charge, pi = p.id;
    at(now_ + pg(), [this, id, s, ch, pi] {
        if (!alive(id)) return;
        delivery& d = deliveries_[id];
        settle(d.key, s, ch, pi);
        fin(d);
    });
}

// A new key generation, once no call under the current one has shown life for the quiet period.
void world::bump(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    row* r = find_row(d.key);
    if (!r || !r->pending() || r->epoch != d.epoch || r->rec.key_generation != d.gen)
        return req(d, p_.retry_same_key_delay);
    ms_t quiet = has(safeguard::quiet_period) ? p_.quiet : 0;
    ms_t life = r->last_life >= 0 ? r->last_life : r->first_attempt >= 0 ? r->first_attempt : now_ - quiet;
    ms_t wait = std::max<ms_t>(0, life + quiet - now_);
    if (wait > 0) {
        release(d.key, d.epoch);
        return req(d, std::min(wait, p_.max_requeue));
    }
    ++r->rec.key_generation;
    r->indeterminate_since = -1;
    d.gen = r->rec.key_generation;
    note("bump " + d.key + " g" + std::to_string(d.gen));
    at(now_ + pg(), [this, id] { attempt_then_call(id); });
}

}  // namespace cg::sim::detail
