// The vault proxy's resolver (src/vault/resolver.cpp) for a reservation left `uncertain` (a 5xx, a 409, no
// answer): after first_resolve_delay it replays the stored request under its Idempotency-Key — Stripe replays
// what it saved, or executes the request now —, and vault::replay_settlement decides: settle, release, defer
// (again after exponential backoff, as backoff_for), or search the customer's PaymentIntents and charges for
// the vault's tag. It replays only while the row is younger than half the flow's quiet period (the proxy's
// default --replay-window) and searches after (config::resolver_replay_late: within the 23 h window, as it
// shipped before — a replay that late can charge under a key the flow has abandoned for a new generation).
#include <chrono>
#include <cstdint>
#include <string>

#include "net/backoff.hpp"
#include "stripe/fact.hpp"
#include "stripe/types.hpp"
#include "vault/policy.hpp"
#include "world.hpp"

namespace cg::sim::detail {

using spend = spend_row::state;

void world::resolve(const std::string& period, int i) {
    vault_key& k = vault_[period];
    if (k.rows[i].st != spend::uncertain) return;  // settled or released since (a retry's answer)
    const std::string idem = k.rows[i].idempotency_key;
    if (!cfg_.resolver_replay_late && now_ - k.rows[i].reserved_at >= p_.quiet / 2) {
        note("vault resolver searches " + idem);
        return resolver_search(k, k.rows[i]);
    }
    auto s = saved_.find(idem);
    const bool replayed = s != saved_.end() && now_ - s->second.first < p_.idempotency_ttl;
    request q = requests_[k.rows[i].request];
    q.delivery = -1;
    q.http = 0;
    q.charge = q.intent_idx = q.vault_row = -1;
    requests_.push_back(q);
    const int rq = static_cast<int>(requests_.size()) - 1;
    stripe_execute(rq);
    const request& a = requests_[rq];
    vault::replay_answer ans;
    ans.status = a.http;
    ans.replayed = replayed;
    ans.error_type = a.http == 402   ? "card_error"
                     : a.http == 429 ? "rate_limit_error"
                     : a.http >= 500 ? "api_error"
                                     : "";
    note("vault resolver replays " + idem + ": " + std::to_string(a.http));
    spend_row& r = k.rows[i];
    switch (vault::replay_settlement(ans)) {
        case vault::replay_action::settle:
            return vault_settled(k, r, a);
        case vault::replay_action::release:
            r.st = spend::released;
            k.committed -= r.amount;
            return;
        case vault::replay_action::defer: {
            const auto wait = net::exponential_delay(std::chrono::milliseconds(5 * sec),
                                                     static_cast<std::uint64_t>(r.attempts++),
                                                     std::chrono::milliseconds(10 * minute));
            at(now_ + wait.count(), [this, period, i] { resolve(period, i); });
            return;
        }
        case vault::replay_action::search:
            return resolver_search(k, r);
    }
}

// resolver.cpp search(): for a /v1/payment_intents row the PaymentIntent carrying the tag, settled while
// money may still move under it (stripe::money_may_move), else released; then the charge carrying it, failed
// → released, else settled; nothing → released. A settled find that may still move money but has not is
// followed (store::settle with its status), as the owner's answer is. The lists show Stripe's writes at once,
// as resolver.cpp assumes (config::resolver_list_lag: once the list lag has passed, as recovery's search sees
// them).
void world::resolver_search(vault_key& k, spend_row& r) {
    const bool intent_row = requests_[r.request].intent;
    const bool lag = cfg_.resolver_list_lag;
    auto release = [&] {
        r.st = spend::released;
        k.committed -= r.amount;
    };
    if (intent_row)
        for (int i = 0; i < static_cast<int>(intents_.size()); ++i) {
            const stripe_intent& pi = intents_[i];
            if (pi.idempotency_key != r.idempotency_key || (lag && now_ < pi.visible_at)) continue;
            stripe::payment_intent p;
            p.id = pi.id;
            p.status = pi.status;
            if (pi.charge >= 0) p.latest_charge = charges_[pi.charge].id;
            const auto moved = stripe::read(p).moved;
            if (!stripe::money_may_move(moved)) return release();
            r.st = spend::settled;
            r.intent = i;
            r.in_flight = has(safeguard::follow_until_ended) && followed(moved);
            return;
        }
    for (int i = 0; i < static_cast<int>(charges_.size()); ++i) {
        const stripe_charge& ch = charges_[i];
        if (ch.idempotency_key != r.idempotency_key || (lag && now_ < ch.visible_at)) continue;
        stripe::charge c;
        c.id = ch.id;
        c.status = ch.status;
        c.payment_method_type = ch.payment_method_type;
        const auto moved = stripe::read(c).moved;
        if (moved == stripe::movement::failed) return release();
        r.st = spend::settled;
        r.charge = i;
        r.in_flight = has(safeguard::follow_until_ended) && followed(moved);
        return;
    }
    release();
}

}  // namespace cg::sim::detail
