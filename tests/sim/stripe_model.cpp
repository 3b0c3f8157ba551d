// Stripe: charges, the 24 h idempotency cache, list lag, bank debits that settle later, webhooks (duplicated,
// reordered, lost) and the receiver and the poll that apply them through billing::apply_fact.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "billing/machine/key.hpp"
#include "world.hpp"

namespace cg::sim::detail {

void world::money_check(const std::string& billing_key) {
    if (live_[billing_key] > 1)
        violation("two payments moved (or moving) money for key " + billing_key + ": " +
                  std::to_string(live_[billing_key]));
}

void world::stripe_execute(int rq) {
    request& q = requests_[rq];
    note("stripe executes " + q.idempotency_key);
    ++result_.stripe_creates;
    auto s = saved_.find(q.idempotency_key);
    if (s != saved_.end() && now_ - s->second.first >= p_.idempotency_ttl) {
        saved_.erase(s);  // Stripe prunes keys after 24 h
        s = saved_.end();
    }
    if (s != saved_.end()) {  // a replay: the saved answer, whatever it was
        q.http = s->second.http;
        q.charge = s->second.charge;
        q.intent_idx = s->second.intent;
        return;
    }
    const event_spec& e = events_[q.event];
    const bool storm = now_ < storm_until_;
    if (fault(storm ? 0.5 : 0.04)) {  // 429: nothing happened, nothing saved
        q.http = 429;
        return;
    }
    if (fault(0.03)) {  // a 500 before the create ran: nothing saved
        q.http = 500;
        return;
    }
    if (q.intent) return create_intent(q, e);
    stripe_charge ch;
    ch.id = "ch_" + std::to_string(charges_.size() + 1);
    ch.billing_key = q.billing_key;
    ch.owner = q.billing_key;
    ch.idempotency_key = q.idempotency_key;
    ch.amount = q.amount;
    ch.created = now_;
    ch.visible_at = now_ + (fault(0.3) ? rnd_.range(0, 20 * sec) : 0);
    ch.payment_method_type = e.debit ? (rnd_.chance(0.5) ? "ach_debit" : "sepa_debit") : "card";
    const bool declines = e.declines && !e.fixed;
    ch.status = declines ? "failed" : e.debit ? "pending" : "succeeded";
    int idx = static_cast<int>(charges_.size());
    charges_.push_back(ch);
    q.charge = idx;
    q.http = declines ? 402 : 200;
    if (fault(0.03)) q.http = 500;  // the create ran, then Stripe failed: the 500 is saved and replayed
    saved_[q.idempotency_key] = {now_, q.http, idx};
    if (ch.status != "failed") money_moves(charges_[idx], 1);
    emit_webhook(idx);
    if (e.debit) at(now_ + rnd_.range(10 * minute, 12 * hour), [this, idx] { settle_debit(idx); });
}

// POST /v1/payment_intents with confirm=true: the intent, and its charge unless the confirm never ran.
void world::create_intent(request& q, const event_spec& e) {
    stripe_intent pi;
    pi.id = "pi_" + std::to_string(intents_.size() + 1);
    pi.billing_key = q.billing_key;
    pi.idempotency_key = q.idempotency_key;
    pi.created = now_;
    pi.visible_at = now_ + (fault(0.3) ? rnd_.range(0, 20 * sec) : 0);
    const int pidx = static_cast<int>(intents_.size());
    q.intent_idx = pidx;
    if (fault(0.03)) {
        // Stripe created the intent and failed before the confirm ran: requires_confirmation, the 500 saved.
        pi.status = pi.created_status = "requires_confirmation";
        intents_.push_back(pi);
        q.http = 500;
        saved_[q.idempotency_key] = {now_, q.http, -1, pidx};
        emit_intent_webhook(pidx);
        return;
    }
    if (e.needs_auth && !e.fixed) {
        // On-session, the card asks for 3-D Secure: the intent waits for the customer, no charge yet (200).
        pi.status = pi.created_status = "requires_action";
        intents_.push_back(pi);
        q.http = 200;
        saved_[q.idempotency_key] = {now_, q.http, -1, pidx};
        emit_intent_webhook(pidx);
        // Some customers the operator retries authenticate the old intent meanwhile (a row nobody retries
        // learns of it only by its webhook, which the fault model may lose for good).
        if (e.retry && rnd_.chance(0.3))
            at(now_ + rnd_.range(minute, 2 * hour), [this, pidx] { authenticate(pidx); });
        return;
    }
    const bool declines = e.declines && !e.fixed;
    stripe_charge ch;
    ch.id = "ch_" + std::to_string(charges_.size() + 1);
    ch.owner = q.billing_key;  // no metadata: Stripe does not copy the intent's to its charge
    ch.payment_intent = pi.id;
    ch.idempotency_key = q.idempotency_key;
    ch.amount = q.amount;
    ch.created = now_;
    ch.visible_at = pi.visible_at;
    ch.payment_method_type = e.debit ? "us_bank_account" : "card";
    ch.status = declines ? "failed" : e.debit ? "pending" : "succeeded";
    const int idx = static_cast<int>(charges_.size());
    charges_.push_back(ch);
    pi.charge = idx;
    pi.status = pi.created_status = declines  ? "requires_payment_method"
                                    : e.debit ? "processing"
                                              : "succeeded";
    if (declines) pi.failed_method = ch.payment_method_type;
    intents_.push_back(pi);
    q.charge = idx;
    q.http = declines ? 402 : 200;
    if (fault(0.03)) q.http = 500;
    saved_[q.idempotency_key] = {now_, q.http, idx, pidx};
    if (ch.status != "failed") money_moves(charges_[idx], 1);
    emit_webhook(idx);
    emit_intent_webhook(pidx);
    if (e.debit) at(now_ + rnd_.range(10 * minute, 12 * hour), [this, idx] { settle_debit(idx); });
}

// The customer completes 3-D Secure on an intent left requires_action (while it is not canceled): it
// succeeds with a charge of its own.
void world::authenticate(int pidx) {
    stripe_intent& pi = intents_[pidx];
    if (!faults_ || pi.status != "requires_action") return;
    stripe_charge ch;
    ch.id = "ch_" + std::to_string(charges_.size() + 1);
    ch.owner = pi.billing_key;
    ch.payment_intent = pi.id;
    ch.idempotency_key = "(customer)";
    for (const auto& e : events_)
        if (e.key == pi.billing_key) ch.amount = e.ev.amount_cents;
    ch.created = now_;
    ch.visible_at = now_;
    ch.payment_method_type = "card";
    ch.status = "succeeded";
    const int idx = static_cast<int>(charges_.size());
    charges_.push_back(ch);
    pi.charge = idx;
    pi.status = "succeeded";
    note("customer authenticates " + pi.id);
    money_moves(charges_[idx], 1);
    emit_webhook(idx);
    emit_intent_webhook(pidx);
    vault_payments_ended();
}

void world::settle_debit(int idx) {
    stripe_charge& ch = charges_[idx];
    // A debit the customer's bank refuses fails, unless the operator replayed it once the account was fixed.
    const int e = event_of(ch.owner);
    const bool fixed = e >= 0 && events_[e].fixed;
    ch.status = rnd_.chance(0.75) || fixed ? "succeeded" : "failed";
    note("debit " + ch.id + " " + ch.status);
    if (ch.status == "failed") money_moves(ch, -1);
    emit_webhook(idx);
    for (int i = 0; i < static_cast<int>(intents_.size()); ++i)
        if (intents_[i].charge == idx) {
            // A failed debit returns its intent to requires_payment_method.
            intents_[i].status = ch.status == "succeeded" ? "succeeded" : "requires_payment_method";
            if (ch.status == "failed") intents_[i].failed_method = ch.payment_method_type;
            emit_intent_webhook(i);
        }
    vault_payments_ended();
}

std::string charge_event_json(const std::string& evt, const std::string& type, ms_t created,
                              const std::string& id, const std::string& status, const std::string& key,
                              const std::string& payment_intent) {
    return "{\"id\":\"" + evt + "\",\"object\":\"event\",\"type\":\"" + type +
           "\",\"created\":" + std::to_string(created / 1000) +
           ",\"livemode\":false,\"data\":{\"object\":{\"id\":\"" + id +
           "\",\"object\":\"charge\",\"status\":\"" + status + "\",\"payment_intent\":" +
           (payment_intent.empty() ? std::string("null") : "\"" + payment_intent + "\"") +
           ",\"amount_refunded\":0,\"metadata\":{" + (key.empty() ? "" : "\"billing_key\":\"" + key + "\"") +
           "}}}}";
}

std::string intent_event_json(const std::string& evt, const std::string& type, ms_t created,
                              const stripe_intent& pi, const std::string& latest_charge) {
    return "{\"id\":\"" + evt + "\",\"object\":\"event\",\"type\":\"" + type +
           "\",\"created\":" + std::to_string(created / 1000) +
           ",\"livemode\":false,\"data\":{\"object\":{\"id\":\"" + pi.id +
           "\",\"object\":\"payment_intent\",\"status\":\"" + pi.status + "\",\"latest_charge\":" +
           (latest_charge.empty() ? std::string("null") : "\"" + latest_charge + "\"") +
           ",\"metadata\":{\"billing_key\":\"" + pi.billing_key + "\"}}}}";
}

// Stripe's webhooks: at least once, in any order; some lost while faults last.
void world::emit_webhook(int idx) {
    const stripe_charge& ch = charges_[idx];
    std::string body = charge_event_json("evt_" + std::to_string(++seq_), "charge." + ch.status, now_, ch.id,
                                         ch.status, ch.billing_key, ch.payment_intent);
    if (fault(0.1)) return;  // lost
    auto f = read_webhook(body);
    if (!f) return;
    int copies = fault(0.2) ? 2 : 1;
    for (int i = 0; i < copies; ++i)
        at(now_ + rnd_.range(0, faults_ ? 10 * minute : 2 * sec), [this, f] { receive_webhook(*f, false); });
}

// The receiver reads the body with the real parser (once per event: its copies are the same bytes).
std::optional<billing::payment_fact> world::read_webhook(const std::string& body) {
    auto f = billing::parse_event_fact(body);
    if (!f) {
        violation("webhook body unreadable: " + f.err().describe());
        return std::nullopt;
    }
    return std::move(*f);
}

// The webhook receiver: the row by charge id, else by metadata[billing_key]; a pending row's facts wait.
void world::emit_intent_webhook(int idx) {
    const stripe_intent& pi = intents_[idx];
    std::string type = pi.status == "succeeded"                 ? "payment_intent.succeeded"
                       : pi.status == "processing"              ? "payment_intent.processing"
                       : pi.status == "requires_payment_method" ? "payment_intent.payment_failed"
                       : pi.status == "requires_action"         ? "payment_intent.requires_action"
                       : pi.status == "canceled"                ? "payment_intent.canceled"
                                                                : "payment_intent.created";
    std::string body = intent_event_json("evt_" + std::to_string(++seq_), type, now_, pi,
                                         pi.charge >= 0 ? charges_[pi.charge].id : std::string());
    if (fault(0.1)) return;  // lost
    auto f = read_webhook(body);
    if (!f) return;
    int copies = fault(0.2) ? 2 : 1;
    for (int i = 0; i < copies; ++i)
        at(now_ + rnd_.range(0, faults_ ? 10 * minute : 2 * sec), [this, f] { receive_webhook(*f, false); });
}

// The receiver finds the row by the ids the event names (charge, PaymentIntent), then by
// metadata[billing_key]; a pending row's facts are recorded and applied once the pipeline settled it.
void world::receive_webhook(const billing::payment_fact& f, bool foreign) {
    note("webhook " + f.source + " " + f.charge_id);
    row* r = nullptr;
    for (auto& [k, x] : rows_)
        if ((!f.charge_id.empty() && x.rec.charge_id == f.charge_id) ||
            (!f.payment_intent_id.empty() && x.payment_intent_id == f.payment_intent_id))
            r = &x;
    if (!r && !f.billing_key.empty()) r = find_row(f.billing_key);
    if (!r || r->pending()) {
        const std::string& by = !f.billing_key.empty()         ? f.billing_key
                                : !f.payment_intent_id.empty() ? f.payment_intent_id
                                                               : f.charge_id;
        stashed_[by].emplace_back(f, foreign);
        return;
    }
    apply_to_row(*r, f, foreign);
}

void world::apply_to_row(row& r, const billing::payment_fact& fact, bool foreign) {
    billing::payment_fact f = fact;
    const auto before = r.settlement();
    if (!has(safeguard::same_payment)) {
        // A matcher that takes the key's metadata for the row's payment (no id comparison).
        if (r.rec.charge_id) f.charge_id = *r.rec.charge_id;
        if (r.payment_intent_id) f.payment_intent_id = *r.payment_intent_id;
    }
    auto c = billing::apply_fact(before, f);
    if (c.result != billing::settle_result::applied) return;
    if (foreign) violation("a fact about another payment changed row " + r.rec.key + " (" + f.source + ")");
    commit(&r, r, before.status == record_status::processing);  // the poll reads a processing row again
    if (c.row.status != r.rec.status) set_status(r, c.row.status);
    r.rec.charge_id = c.row.charge_id;
    r.payment_intent_id = c.row.payment_intent_id;
    r.refunded_cents = c.row.refunded_cents;
    r.disputed_cents = c.row.disputed_cents;
    r.dispute_status = c.row.dispute_status;
    note("settled " + r.rec.key + " " + std::string(billing::to_string(r.rec.status)));
}

// The poll of rows left processing: each retrieved by its charge id and read as settlement reads it.
void world::poll() {
    for (auto& [k, r] : rows_) {
        if (r.rec.status != record_status::processing || now_ - r.processing_since < p_.poll_after) continue;
        if (fault(0.2) || !r.rec.charge_id) continue;  // the retrieve failed: next poll
        const stripe_charge* ch = nullptr;
        for (const auto& c : charges_)
            if (c.id == *r.rec.charge_id) ch = &c;
        if (!ch) {
            violation("row " + k + " names a charge Stripe does not have");
            continue;
        }
        billing::payment_fact f;
        f.kind = billing::fact_kind_for_charge_status(ch->status);
        f.source = "retrieve charge";
        f.charge_id = ch->id;
        f.billing_key = ch->billing_key;
        f.status = ch->status;
        f.created = now_ / 1000;
        apply_to_row(r, f, false);
    }
    // The poll runs while anything else may still happen, or a row still waits for it.
    bool waiting = queue_.size() > static_cast<std::size_t>(sweep_ticks_);  // the sweepers' ticks aside
    for (const auto& [k, r] : rows_) waiting = waiting || r.rec.status == record_status::processing;
    if (waiting && now_ < cfg_.fault_ms + p_.horizon) at(now_ + p_.poll_every, [this] { poll(); });
}

}  // namespace cg::sim::detail
