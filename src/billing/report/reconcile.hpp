// The pure part of `chargeguard reconcile`: reading the expected billing run, classifying each (customer,
// period) against the ledger and Stripe (its Stripe requests paced by billing/machine/request_pacer.hpp). No
// I/O, no clock: the command gathers the facts (src/app/cmd_reconcile.cpp) and this file decides, so the
// table is tested without a database.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "billing/machine/decision.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/request_pacer.hpp"
#include "core/result.hpp"

namespace cg::billing {

// One line of the expected run: the event, and the exact body to publish for it (the JSONL line as it was,
// or the CSV row rendered as JSON), so a re-publish hashes to the same key.
struct expected_event {
    billing_event event;
    std::string body;
    std::size_t line = 0;
    // The run also lists corrections of this (customer, period) (docs/design.md §4a): the new total of its
    // highest revision, which the money moved for the period must equal. `event` stays the original charge.
    std::optional<std::int64_t> corrected_total;
    std::int32_t corrected_revision = 0;
};

// JSONL (one event per line; blank lines skipped) or CSV with a header naming at least customer_id,
// billing_period, amount_cents, currency, stripe_customer_id (description, payment_method, off_session
// (true/false) and stripe_account (acct_…; empty: the platform) optional; columns in any order;
// double-quoted fields with "" escapes). The format is told by the first non-blank character: '{' → JSONL.
// Fails on the first invalid line, naming it ("line 7: amount_cents: …"), or on a (customer, period) listed
// twice with different payloads under one revision; lines with a revision are the period's corrections.
// An entry is a (customer, period, stripe_account): the same customer and period on the platform and on a
// connected account are two charges, as they are two ledger rows.
result<std::vector<expected_event>> parse_expected(std::string_view text);

// The event as the JSON object `consume` reads.
std::string event_json(const billing_event& ev);

// A Stripe charge as reconcile needs it.
struct charge_fact {
    std::string id;
    std::int64_t amount = 0;
    std::string currency;
    std::string customer;
    std::string status;  // succeeded | pending | failed
    std::string billing_key;
};

// Everything known about one base key.
struct recon_facts {
    std::string key;
    std::optional<expected_event> expected;
    std::optional<ledger_record> record;
    // Charges at Stripe whose metadata[billing_key] is this key (any status).
    std::vector<charge_fact> charges;
    // For a record with a charge_id: that charge as Stripe returns it, nullopt when Stripe says it does not
    // exist. Unset (recorded_charge_known false) when it was not looked up.
    bool recorded_charge_known = false;
    std::optional<charge_fact> recorded_charge;
    // An open (not replayed) dead letter for this event.
    std::optional<std::string> dead_letter_reason;
    // With corrections recorded for the row: the money the ledger moved for the period (the original charge,
    // plus correction charges, less correction refunds: cg_correction_net_cents), and whether a revision is
    // still under way. Unset: no corrections (the original's amount is the period's).
    std::optional<std::int64_t> corrected_net;
    bool correction_open = false;
};

enum class recon_class {
    ok,                // charged once, ledger and Stripe agree with the expected event
    missing,           // expected, no ledger row, no dead letter: the message was lost
    pending,           // ledger row still pending after the recovery search
    absent_at_stripe,  // charged in the ledger; the charge does not exist or is another customer's/amount's
    not_in_ledger,  // a charge carrying our key that the ledger does not know (no row, or another charge id)
    mismatch,       // the ledger's amount, currency or Stripe customer differs from the expected event
    declined,       // settled as declined (final, explained)
    dead_lettered,  // a dead letter holds it (invalid, conflict, Stripe rejected, …): replay once fixed
    cap_blocked,    // the spend cap refused it (explained; raise the cap and replay)
    processing,     // Stripe answered processing: the bank has not said yet (explained; a webhook or the
                    // poll settles it)
};
inline constexpr std::size_t recon_class_count = 10;
std::string_view to_string(recon_class c) noexcept;
// ok, declined, dead_lettered, cap_blocked and processing have a recorded reason; the others leave reconcile
// unhappy.
bool is_explained(recon_class c) noexcept;

struct recon_verdict {
    recon_class cls = recon_class::ok;
    std::string detail;  // one line for the table
};

recon_verdict classify(const recon_facts& f);

}  // namespace cg::billing
