// RECOVER's Stripe lists and the new key generation, as the charge fsm's commands (search_charges,
// search_intents, bump_generation) find them in the models: the lists as stripe/client.cpp's
// find_charge_by_billing_key and find_payment_intent_by_billing_key return them, the generation as
// ledger_sql.hpp's bump statement moves it. The fsm reads what they return (machine::on_found,
// machine::superseded_failure); a removed safeguard is a list that shows what the
// code without it would have read.
#include <algorithm>
#include <optional>
#include <string>

#include "billing/machine/charge_fsm.hpp"
#include "stripe/fact.hpp"
#include "world.hpp"

namespace cg::sim::detail {

namespace in = billing::machine::in;

namespace {

bool listed(ms_t created, ms_t visible_at, ms_t now, const std::optional<std::int64_t>& since) {
    return visible_at <= now && (!since || created / 1000 >= *since);
}

}  // namespace

// The customer's charges carrying the key in metadata, newest first, a payment that did not fail preferred
// (stripe/client.cpp find_charge_by_billing_key).
billing::machine::fsm_input world::search_charges(int id, const billing::machine::search_query& q) {
    const delivery& d = deliveries_[id];
    if (fault(0.02)) return in::failed{error{core_errc::io_error, "the list failed"}};
    if (!has(safeguard::search_before_new_key)) return in::charge_found{};  // never looked
    const stripe_charge* found = nullptr;
    for (auto it = charges_.rbegin(); it != charges_.rend(); ++it) {  // newest first, as Stripe lists
        const auto& c = *it;
        if (c.billing_key != q.key || !listed(c.created, c.visible_at, now_, q.since)) continue;
        if (!found || (found->status == "failed" && c.status != "failed")) found = &c;
    }
    if (!found) {
        note("search " + d.key + " none");
        return in::charge_found{};
    }
    stripe::charge sc;
    sc.id = found->id;
    sc.status = found->status;
    sc.payment_method_type = found->payment_method_type;
    sc.payment_intent = found->payment_intent;
    sc.created = found->created / 1000;
    const bool debit_failed = sc.status == "failed" && stripe::bank_debit(sc.payment_method_type);
    // Without the safeguard a failed debit reads as a card's decline; a pending charge as paid.
    if (debit_failed && !has(safeguard::failed_debit_processing)) sc.payment_method_type = "card";
    if (sc.status == "pending" && !has(safeguard::in_flight_not_charged)) sc.status = "succeeded";
    note("search " + d.key + " found " + sc.id + " " + sc.status);
    return in::charge_found{std::move(sc)};
}

// Then, for an event charged through a PaymentIntent, the customer's PaymentIntents carrying the key
// (find_payment_intent_by_billing_key: the newest).
billing::machine::fsm_input world::search_intents(int id, const billing::machine::search_query& q) {
    const delivery& d = deliveries_[id];
    if (!has(safeguard::search_before_new_key)) return in::intent_found{};
    const stripe_intent* found = nullptr;
    for (auto it = intents_.rbegin(); it != intents_.rend() && !found; ++it)
        if (it->billing_key == q.key && listed(it->created, it->visible_at, now_, q.since)) found = &*it;
    if (!found) {
        note("search intents " + d.key + " none");
        return in::intent_found{};
    }
    stripe::payment_intent p;
    p.id = found->id;
    p.status = found->status;
    p.created = found->created / 1000;
    // Without the safeguard the intent is read as its status alone: a failed debit looks declined.
    if (has(safeguard::failed_debit_processing)) p.payment_method_type = found->failed_method;
    if (found->charge >= 0) p.latest_charge = charges_[found->charge].id;
    // Without it, an intent never tried reads as declined (the reading create used to have); an intent in
    // flight as paid.
    if (p.status == "requires_confirmation" && !has(safeguard::not_tried_not_declined))
        p.status = "requires_payment_method";
    if (p.status == "processing" && !has(safeguard::in_flight_not_charged)) p.status = "succeeded";
    note("search intents " + d.key + " " + p.id + " " + p.status);
    return in::intent_found{std::move(p)};
}

// A new key generation, once no call under the current one has shown life for the quiet period.
billing::machine::fsm_input world::bump(int id, const billing::machine::command& c) {
    delivery& d = deliveries_[id];
    const auto& f = *d.fsm;
    row* r = find_row(d.key);
    if (!r || !r->pending() || r->epoch != f.held_lease() || r->rec.key_generation != f.generation())
        return in::bumped{};
    ms_t quiet = !has(safeguard::quiet_period) ? 0 : c.quiet ? c.quiet->count() : p_.quiet;
    ms_t life = r->last_life >= 0 ? r->last_life : r->first_attempt >= 0 ? r->first_attempt : now_ - quiet;
    ms_t wait = std::max<ms_t>(0, life + quiet - now_);
    if (wait > 0) return in::bumped{std::nullopt, std::chrono::milliseconds(std::min(wait, p_.max_requeue))};
    commit(r, *r);
    ++r->rec.key_generation;
    r->indeterminate_since = -1;
    note("bump " + d.key + " g" + std::to_string(r->rec.key_generation));
    return in::bumped{r->rec.key_generation};
}

}  // namespace cg::sim::detail
