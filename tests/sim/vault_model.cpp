// The spend-cap vault (docs/design.md §5, docs/operating/vault.md) between the sidecars' create calls and
// Stripe: one vault key per billing period, its cap the period's expected total × 1.10 (vault::cap_for, the
// arithmetic `vault issue` uses). Each create is reserved against the cap before it is forwarded, as
// migration 0025's cg_vault_step reserves an element; a refusal is the proxy's own answer
// (vault::refusals::cap_exceeded written by vault::error_body, which the sidecar reads as
// stripe/client_call.cpp reads any error body); the proxy settles the reservation by what the answer means
// for its owner (vault::owner_settlement, settlement_queue.cpp's account()), the resolver's check_in_flight
// gives the room of a payment that ended without moving money back, and a cancel through the proxy
// (forward_cancel) releases its intent's reservation at once. The upstream bug the cap exists for — a
// period's event published again as another customer's, or for the period's whole total — is upstream_bug().
//
// Two schedules in three go through it (vault_on_), the others call Stripe directly. The resolver takes up an
// `uncertain` row (vault_resolver.cpp). Not modelled: cap leases (their spends are rows under the same
// arithmetic); the key_expired refusal of a key reused past the proxy's same-key window (the fsm's own window
// is what the simulator tests); a proxy that dies with rows left `reserved`.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "billing/machine/key.hpp"
#include "stripe/fact.hpp"
#include "stripe/types.hpp"
#include "vault/cap.hpp"
#include "vault/policy.hpp"
#include "vault/refusals.hpp"
#include "world.hpp"

namespace cg::sim::detail {

using spend = spend_row::state;

// vault issue: per period, the cap of its valid events' expected total with the operator's 1.10 headroom.
void world::vault_open() {
    std::unordered_map<std::string, std::int64_t> expected;
    for (const auto& e : events_) expected[e.ev.billing_period] += e.ev.amount_cents;
    const auto headroom = vault::parse_headroom("1.10");
    for (const auto& e : events_) period_of_[e.key] = e.ev.billing_period;
    for (const auto& [period, total] : expected) {
        auto cap = vault::cap_for(total, *headroom);
        vault_[period].cap = *cap;
    }
}

// The upstream bug, in some schedules: one valid event published again, under another customer id (so
// another billing key, the same Stripe customer) for the same amount, or for the period's whole expected
// total. Its own random stream: the schedules without it stay as they were.
void world::upstream_bug(rng& bug) {
    if (!bug.chance(0.3)) return;
    event_spec e = events_[bug.next() % static_cast<std::uint64_t>(cfg_.events)];
    if (bug.chance(0.3)) {
        e.ev.amount_cents = 0;
        for (int i = 0; i < cfg_.events; ++i)
            if (events_[i].ev.billing_period == e.ev.billing_period)
                e.ev.amount_cents += events_[i].ev.amount_cents;
    }
    e.ev.customer_id = "legacy-" + e.ev.customer_id;
    e.key = billing::base_key("sim", e.ev.customer_id, e.ev.billing_period);
    e.upstream_bug = true;
    period_of_[e.key] = e.ev.billing_period;
    e.retry = e.replay = false;
    events_.push_back(std::move(e));
    const int idx = static_cast<int>(events_.size()) - 1;
    at(bug.range(0, cfg_.fault_ms / 2), [this, idx] { publish(idx); });
}

// What cg_vault_step (0025) does with one create of a batch, under the key's row lock: a new Idempotency-Key
// is inserted and counted if committed + amount <= cap; an existing row is a retry, forwarded and not
// counted again (`existing`), unless it was released, when it is counted again at its amount if it fits
// (`rereserved`); past the cap, `cap_exceeded` and nothing written. False: refused (the answer is in the
// request).
bool world::vault_forward(int rq) {
    request& q = requests_[rq];
    const event_spec& e = events_[q.event];
    vault_key& k = vault_[e.ev.billing_period];
    if (!vault_on_ || !has(safeguard::cap_reservation)) return true;  // nothing reserved or counted
    const bool fits = k.committed + q.amount <= k.cap;
    auto it = k.by_key.find(q.idempotency_key);
    if (it != k.by_key.end() && has(safeguard::retry_counted_once)) {
        spend_row& r = k.rows[it->second];
        q.vault_row = it->second;
        q.vault_state = r.st;
        if (r.st != spend::released) return true;  // existing (the fsm re-sends a key only at its amount)
        if (fits) {
            r = spend_row{q.idempotency_key, q.amount};
            r.request = rq;
            r.reserved_at = now_;
            k.committed += q.amount;
            q.vault_owner = true;
            q.vault_state = spend::reserved;
            return true;
        }
    } else if (fits) {
        // Without retry_counted_once a retry is a new reservation like any other (a second row).
        k.rows.push_back(spend_row{q.idempotency_key, q.amount});
        k.rows.back().request = rq;
        k.rows.back().reserved_at = now_;
        q.vault_row = k.by_key[q.idempotency_key] = static_cast<int>(k.rows.size()) - 1;
        k.committed += q.amount;
        q.vault_owner = true;
        return true;
    }
    const auto refusal = vault::refusals::cap_exceeded(k.cap, k.committed, e.ev.currency);
    q.http = refusal.status;
    q.refusal = vault::error_body(refusal);
    ++result_.cap_refusals;
    note("vault refuses " + q.idempotency_key + " (committed " + std::to_string(k.committed) + " of " +
         std::to_string(k.cap) + ")");
    if (!e.upstream_bug) {
        // The cap owed this refusal only if the reservations that may still move money, each
        // Idempotency-Key counted once, left no room (other events', a bug's, an older key generation's that
        // may still charge): one it still counted for a payment that ended without moving money is room it
        // owed back.
        const bool owed = counted_once(k) + q.amount > k.cap;
        auto [r, first] = cap_refused_.emplace(q.event, owed);
        if (!first) r->second = r->second && owed;
    }
    return false;
}

// What the key's reservations hold, each Idempotency-Key counted once, leaving out a settled one whose
// payment Stripe says can no longer move money (failed, canceled): the room a refusal may be owed to.
std::int64_t world::counted_once(const vault_key& k) const {
    std::int64_t sum = 0;
    for (const auto& [idem, i] : k.by_key) {
        bool counted = false;
        for (const auto& r : k.rows)
            counted = counted || (r.idempotency_key == idem && r.counted() &&
                                  (r.st != spend::settled || stripe::money_may_move(vault_payment_now(r))));
        if (counted) sum += k.rows[i].amount;
    }
    return sum;
}

// The proxy has Stripe's answer (or gave up waiting: no answer after sending): settlement_queue.cpp's
// account(). The owner's reservation moves by vault::owner_settlement — settled on a 2xx, released on a
// definitive 4xx, uncertain on a 5xx, 409 or no answer — with cg_vault_step's transitions (settled from
// reserved or uncertain; released from reserved or uncertain, giving its amount back; uncertain from
// reserved; any other a no-op). A retry that does not own the row settles it on a 2xx when the row was
// reserved or uncertain as it found it; a row released meanwhile then counts again (the owner's 4xx, a
// retry's 2xx: Stripe did charge). A 2xx whose body shows a payment that may still move money but has not
// is followed (note_in_flight).
void world::vault_account(int rq, bool timed_out) {
    const request& q = requests_[rq];
    if (q.vault_row < 0) return;
    vault_key& k = vault_[events_[q.event].ev.billing_period];
    spend_row& r = k.rows[q.vault_row];
    const auto how = vault::owner_settlement(timed_out ? 0 : q.http, true);
    if (how == vault::settlement::settle) {
        if (!q.vault_owner && q.vault_state != spend::reserved && q.vault_state != spend::uncertain) return;
        if (r.st == spend::settled) return;
        if (r.st == spend::released) k.committed += r.amount;
        return vault_settled(k, r, q);
    }
    if (!q.vault_owner) return;
    if (how == vault::settlement::release && (r.st == spend::reserved || r.st == spend::uncertain)) {
        r.st = spend::released;
        k.committed -= r.amount;
    } else if (how == vault::settlement::uncertain && r.st == spend::reserved) {
        r.st = spend::uncertain;  // due for the resolver after first_resolve_delay
        const std::string& period = events_[q.event].ev.billing_period;
        at(now_ + 5 * sec, [this, period, row = q.vault_row] { resolve(period, row); });
    }
}

bool followed(stripe::movement m) {
    return stripe::money_may_move(m) && m != stripe::movement::charged;
}

// Settled with the object a 2xx named; its body is the object as Stripe saved it at the create, followed
// when it shows a payment that may still move money but has not (resolver.cpp status_to_follow: a pending
// charge; a processing, requires_capture, requires_action or requires_confirmation intent) — the owner's
// answer, a retry's or the resolver's replay alike. A saved body replayed after its payment ended is found
// ended by check_in_flight's next look.
void world::vault_settled(vault_key& k, spend_row& r, const request& q) {
    r.st = spend::settled;
    r.charge = q.intent ? -1 : q.charge;
    r.intent = q.intent ? q.intent_idx : -1;
    stripe::movement saved = stripe::movement::charged;
    if (r.intent >= 0)
        saved = stripe::intent_movement(intents_[r.intent].created_status);
    else if (r.charge >= 0)
        saved = stripe::charge_movement(
            stripe::bank_debit(charges_[r.charge].payment_method_type) ? "pending" : "succeeded");
    // Without follow_until_ended, the reading before: only a processing or requires_capture intent or a
    // pending charge is followed.
    r.in_flight = has(safeguard::follow_until_ended)
                      ? followed(saved)
                      : saved == stripe::movement::in_flight || saved == stripe::movement::authorised;
    vault_check_in_flight(k, r);
}

// The reservation's payment as Stripe has it now, read by stripe::read (unknown when it names none).
stripe::movement world::vault_payment_now(const spend_row& r) const {
    if (r.intent >= 0) {
        const stripe_intent& pi = intents_[r.intent];
        stripe::payment_intent p;
        p.id = pi.id;
        p.status = pi.status;
        if (pi.charge >= 0) p.latest_charge = charges_[pi.charge].id;
        return stripe::read(p).moved;
    }
    if (r.charge < 0) return stripe::movement::unknown;
    stripe::charge c;
    c.id = charges_[r.charge].id;
    c.status = charges_[r.charge].status;
    c.payment_method_type = charges_[r.charge].payment_method_type;
    return stripe::read(c).moved;
}

// The resolver's check_in_flight (resolver.cpp, store_followup.cpp) for one followed reservation: its
// payment as Stripe has it now; charged → followed no more; failed or canceled → released
// (in_flight_failed_sql: the trigger gives its amount back); anything else → still followed.
void world::vault_check_in_flight(vault_key& k, spend_row& r) {
    if (!r.in_flight || r.st != spend::settled) return;
    const stripe::movement m = vault_payment_now(r);
    if (m == stripe::movement::charged) {
        r.in_flight = false;
    } else if (m == stripe::movement::failed || m == stripe::movement::canceled) {
        r.in_flight = false;
        r.st = spend::released;
        k.committed -= r.amount;
    }
}

// check_in_flight's passes, modelled at the moment a payment ends (a debit settles, a customer
// authenticates, an intent is canceled) rather than at the resolver's next pass: the cap's room comes back no
// earlier than Stripe's money does.
void world::vault_payments_ended() {
    for (auto& [period, k] : vault_)
        for (auto& r : k.rows) vault_check_in_flight(k, r);
}

// forward_cancel: a cancel of an intent the vault tagged for a reservation of the key (owns_intent: settled
// with it, or with no object recorded), once Stripe canceled it, releases that reservation whatever its
// state (release_canceled_sql) before the answer goes back.
void world::vault_cancel(int intent) {
    const stripe_intent& pi = intents_[intent];
    auto p = period_of_.find(pi.billing_key);
    if (!vault_on_ || !has(safeguard::follow_until_ended) || p == period_of_.end() || pi.status != "canceled")
        return;
    vault_key& k = vault_[p->second];
    auto it = k.by_key.find(pi.idempotency_key);
    if (it == k.by_key.end()) return;
    spend_row& r = k.rows[it->second];
    if (r.st == spend::released || (r.intent >= 0 && r.intent != intent)) return;
    r.in_flight = false;
    r.st = spend::released;
    k.committed -= r.amount;
    note("vault releases " + r.idempotency_key + ": " + pi.id + " canceled through the proxy");
}

// The invariant: under each vault key, what Stripe moved or may still move (charges succeeded or pending)
// never exceeds the cap. Kept as each charge is made or fails (with the count of live payments per key),
// and counted again from Stripe's charges at quiescence.
void world::money_moves(const stripe_charge& ch, int sign) {
    live_[ch.owner] += sign;
    if (sign > 0) money_check(ch.owner);
    auto p = period_of_.find(ch.owner);
    if (!vault_on_ || p == period_of_.end()) return;
    std::int64_t& moving = moving_[p->second];
    moving += sign * ch.amount;
    if (sign > 0 && moving > vault_[p->second].cap) cap_exceeded(p->second, moving);
}

void world::cap_exceeded(const std::string& period, std::int64_t moving) {
    violation("the vault cap of " + period + " exceeded: Stripe moved or may move " + std::to_string(moving) +
              " cents, cap " + std::to_string(vault_[period].cap));
}

void world::cap_check() {
    if (!vault_on_) return;
    std::unordered_map<std::string, std::int64_t> moving;
    for (const auto& c : charges_)
        if (c.status != "failed" && period_of_.count(c.owner)) moving[period_of_[c.owner]] += c.amount;
    for (const auto& [period, sum] : moving)
        if (sum > vault_[period].cap) cap_exceeded(period, sum);
}

}  // namespace cg::sim::detail
