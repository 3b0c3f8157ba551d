// The simulator's models of what the charge flow talks to: the ledger (billing_records and the semantics of
// ledger_sql.hpp's statements), Stripe (charges, the idempotency cache, list lag) and a seeded random
// source. Times are simulated milliseconds. Header-only, no Asio.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "billing/machine/decision.hpp"
#include "billing/machine/settlement.hpp"

namespace cg::sim {

using ms_t = std::int64_t;
inline constexpr ms_t sec = 1000;
inline constexpr ms_t minute = 60 * sec;
inline constexpr ms_t hour = 60 * minute;

inline billing::sys_time at_ms(ms_t t) {
    return billing::sys_time(std::chrono::milliseconds(t));
}

// splitmix64: the same numbers on every platform and compiler (std's distributions are not specified).
struct rng {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    bool chance(double p) { return unit() < p; }
    ms_t range(ms_t lo, ms_t hi) {
        return lo + static_cast<ms_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
    }
};

// One billing_records row, as ledger_sql.hpp's statements read and write it.
struct row {
    billing::ledger_record rec;  // key, payload, status, charge_id, key_generation, stripe_attempts
    std::optional<std::string> payment_intent_id;
    ms_t lease_until = -1;  // -1: NULL
    std::int64_t epoch = 1;
    ms_t first_attempt = -1;
    ms_t last_life = -1;  // last_stripe_attempt_at
    ms_t indeterminate_since = -1;
    ms_t processing_since = -1;
    ms_t updated = 0;  // updated_at: the last statement that wrote the row
    std::int64_t refunded_cents = 0;
    std::int64_t disputed_cents = 0;
    std::optional<std::string> dispute_status;

    bool pending() const { return rec.status == billing::record_status::pending; }
    // The row as decide_existing reads it (lease_remaining by the database clock, as the SELECT computes it).
    billing::ledger_record view(ms_t now) const {
        billing::ledger_record r = rec;
        r.lease_until = lease_until < 0 ? std::nullopt : std::optional(at_ms(lease_until));
        r.lease_remaining =
            lease_until < 0 ? std::nullopt
                            : std::optional(std::chrono::milliseconds(std::max<ms_t>(0, lease_until - now)));
        r.first_stripe_attempt_at = first_attempt < 0 ? std::nullopt : std::optional(at_ms(first_attempt));
        r.indeterminate_since =
            indeterminate_since < 0 ? std::nullopt : std::optional(at_ms(indeterminate_since));
        r.lease_epoch = epoch;
        return r;
    }
    billing::settlement_row settlement() const {
        billing::settlement_row s;
        s.status = rec.status;
        s.amount_cents = rec.amount_cents;
        s.charge_id = rec.charge_id;
        s.payment_intent_id = payment_intent_id;
        s.refunded_cents = refunded_cents;
        s.disputed_cents = disputed_cents;
        s.dispute_status = dispute_status;
        return s;
    }
};

// A charge as Stripe holds it.
struct stripe_charge {
    std::string id;
    std::string
        billing_key;    // metadata[billing_key]; empty for a PaymentIntent's charge (Stripe does not copy it)
    std::string owner;  // the key it was made for (the invariants' bookkeeping, not visible to the flow)
    std::string payment_intent;
    std::string idempotency_key;
    std::int64_t amount = 0;
    std::string status;  // succeeded | pending | failed
    std::string payment_method_type;
    ms_t created = 0;
    ms_t visible_at = 0;  // list lag: the list shows it from then on
};

// A PaymentIntent as Stripe holds it (created with confirm=true).
struct stripe_intent {
    std::string id;
    std::string billing_key;      // metadata[billing_key]
    std::string idempotency_key;  // the request that created it (the vault's metadata tag names it too)
    std::string status;           // succeeded | processing | requires_payment_method | requires_confirmation
    int charge = -1;              // latest_charge
    std::string created_status;   // its status when the create answered (the body Stripe saved)
    std::string failed_method;    // last_payment_error.payment_method.type
    ms_t created = 0;
    ms_t visible_at = 0;
};

// What Stripe saved for an idempotency key: the answer it replays for 24 h.
struct saved_answer {
    ms_t first = 0;
    int http = 0;
    int charge = -1;  // index into the charges
    int intent = -1;  // index into the intents
};

// One vault_spend row (migrations 0003, 0004, 0014), as cg_vault_step (0025) and the proxy's settlements
// read and write it: a create the proxy reserved under its Idempotency-Key.
struct spend_row {
    enum class state { reserved, settled, released, uncertain };
    std::string idempotency_key;
    std::int64_t amount = 0;
    state st = state::reserved;
    // settled_status IS NOT NULL (0014): settled with a payment that may still move money but has not (a
    // pending charge; a processing, requires_action or requires_confirmation intent), followed by the
    // resolver's check_in_flight until Stripe says how it ended.
    bool in_flight = false;
    int charge = -1;  // the Stripe object it settled with (stripe_object_id), for the in-flight follow
    int intent = -1;
    int request = -1;  // the request it stores (request_path, request_body): what the resolver replays
    int attempts = 0;  // resolve_attempts
    std::int64_t reserved_at = 0;  // simulated ms
    // vault_keys.committed_cents counts reserved, settled and uncertain rows (reopened_cents is 0: the key
    // is issued without refunds_reopen_cap, and the charge flow refunds nothing).
    bool counted() const { return st != state::released; }
};

// A vault key (vault_keys): one per billing period, its cap and the committed total cg_vault_step keeps.
// Cap leases (0025) are not modelled: a lease's spend is recorded as a reservation row under the same cap
// arithmetic (committed + leased + amount <= cap), so the model reserves every create directly.
struct vault_key {
    std::int64_t cap = 0;
    std::int64_t committed = 0;  // committed_cents
    std::vector<spend_row> rows;
    std::unordered_map<std::string, int> by_key;  // PRIMARY KEY (vault_key_id, idempotency_key)
};

}  // namespace cg::sim
