// What `chargeguard explain` found about one event (app/cmd_explain.cpp gathers it) and its two renderings:
// text for a person, one JSON object for a script. Internal to explain.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stripe/client.hpp"

namespace cg::app::explain_impl {

struct field {
    std::string name;
    std::optional<std::string> value;
};

struct ledger_view {
    std::vector<field> fields;
    bool lease_live = false;
    std::optional<std::string> get(std::string_view name) const {
        for (const auto& f : fields)
            if (f.name == name) return f.value;
        return std::nullopt;
    }
    std::string str(std::string_view name) const { return get(name).value_or(""); }
};

struct letter_view {
    std::string id, reason, received_at;
    std::optional<std::string> replayed_at;
    std::optional<std::string> dismissed_at;
    std::string found_by = "key";  // "key" (its billing_key), or "body" (the customer and period inside it)
    bool open() const { return !replayed_at && !dismissed_at; }
};

// --stripe-customer: one row of the ledger, or one Stripe charge, of that Stripe customer in the period.
struct customer_row_view {
    std::string key, customer_id, status, amount_cents, currency;
    std::optional<std::string> charge_id;
};
struct customer_charge_view {
    std::string id, status, customer_id, amount, currency;  // customer_id: its metadata[customer_id]
};
struct stripe_customer_view {
    std::string stripe_customer;
    std::vector<customer_row_view> rows;
    bool stripe_asked = false;
    std::vector<customer_charge_view> charges;  // metadata[billing_period] = the period
};

struct spend_view {
    std::string vault_key_id, idempotency_key, amount_cents, state, reserved_at;
    std::optional<std::string> stripe_object_id;
};

// One Stripe call a correction revision makes (billing_correction_moves), every column as text.
struct move_view {
    std::string part, kind, amount_cents, status, key_generation;
    std::optional<std::string> refund_of, stripe_object_id, payment_intent_id, last_error;
};

// One revision of the period (billing_corrections, docs/design.md §4a) and its money moves.
struct revision_view {
    std::string key, revision, total_cents, currency, status;
    std::optional<std::string> delta_cents, note, started_at, finished_at;
    std::vector<move_view> moves;
};

// One attempt at the key's charge: the first delivery, then each `retry-declined` (billing_retries), with
// how it ended (the next retry's record of it, or the row for the last one).
struct attempt_view {
    std::string generation;
    std::string started;  // "first delivery", or "retry #3 by alice at …: card updated"
    std::string outcome;  // "declined: card_declined (charge ch_…)", "charged ch_…", "pending"
};

struct stripe_view {
    bool asked = false;
    std::string skipped;  // why not asked
    std::optional<stripe::charge> charge;
    std::optional<stripe::payment_intent> intent;
};

struct explanation {
    std::string key, customer, period, key_namespace;
    std::optional<ledger_view> row;
    std::vector<letter_view> letters;
    std::optional<std::vector<spend_view>> spend;           // nullopt: no vault tables
    std::optional<std::vector<revision_view>> corrections;  // nullopt: no corrections tables (before 0018)
    std::optional<std::string> net_cents;  // the money the ledger has moved for the period (with corrections)
    std::vector<attempt_view> attempts;    // empty: never retried (the row is the one attempt)
    std::optional<stripe_customer_view> by_stripe_customer;  // --stripe-customer
    stripe_view stripe;
    std::string
        state;  // charged | pending | declined | cap_blocked | failed | conflict | dead_lettered | never_seen
    std::string verdict;  // the one line
};

// The explanation as text, or as one JSON object (one line), on stdout.
void print_text(const explanation& x);
void print_json(const explanation& x);

}  // namespace cg::app::explain_impl
