// The pure part of the billing state machine (docs/design.md §4): what to do with a message whose key already
// has a ledger row. No I/O, no clock: `now` is passed in, so the table is tested without a database.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "billing/machine/event.hpp"

namespace cg::billing {

using sys_time = std::chrono::system_clock::time_point;

// processing: Stripe answered but the money has not moved yet (a bank debit); the webhook receiver or the
// poll of rows left processing settles it to charged or failed_after_processing (settlement.hpp).
// failed_after_processing: the payment failed after processing; a dead letter holds the event, whose replay
// charges again under a new key generation.
enum class record_status {
    pending,
    charged,
    declined,
    failed,
    cap_blocked,
    conflict,
    processing,
    failed_after_processing,
};
std::string_view to_string(record_status s) noexcept;
std::optional<record_status> parse_record_status(std::string_view s) noexcept;
// Final states never call Stripe again (processing included: its end comes from Stripe, not from a call).
bool is_final(record_status s) noexcept;

// A billing_records row, as far as decisions need it.
struct ledger_record {
    std::string key;
    std::string customer_id;
    std::string billing_period;
    std::int64_t amount_cents = 0;
    std::string currency;
    std::string stripe_customer_id;
    record_status status = record_status::pending;
    std::optional<std::string> charge_id;
    std::int32_t key_generation = 1;
    std::optional<sys_time> indeterminate_since;
    std::optional<sys_time> lease_until;
    std::optional<sys_time> first_stripe_attempt_at;
    std::int32_t stripe_attempts = 0;
    std::string stripe_account;  // the connected account charged on behalf of; empty: the platform
    // lease_until − now() by the database clock when the row was read (0 once expired); nullopt: no lease.
    std::optional<std::chrono::milliseconds> lease_remaining;
    // Moves forward whenever lease_until is written: the lease token of whoever wrote it (ledger.hpp).
    std::int64_t lease_epoch = 0;
};

enum class existing_action {
    duplicate_finish,    // final state: FIN, count a prevented duplicate
    payload_conflict,    // same customer+period, different amount/currency/customer: dead-letter, FIN
    lease_held_requeue,  // another worker holds the lease: REQ with delay, no Stripe call
    recover_same_key,    // lease expired, safe to re-send under the same key (Stripe replays a success)
    recover_search,      // lease expired, past the replay window or indeterminate: list charges first
};
std::string_view to_string(existing_action a) noexcept;

// Stripe prunes idempotency keys after 24 h; we stop trusting replay an hour earlier.
inline constexpr std::chrono::hours same_key_window{23};

// How long a requeue for a lease held by another worker waits: until that lease can have expired (its
// remaining time by the database clock), never less than `floor`, plus jitter in [0, max(floor, 10 % of the
// wait)) so copies of one event do not come back in lockstep; capped at `cap` (nsqd's --max-req-timeout).
// A remaining time below `floor` is a lease its holder stopped renewing (a dead sidecar's, whose message
// nsqd redelivered as the lease ran out): the wait is that remaining time, at least floor / 10, plus jitter
// in [0, floor / 10). `unit` is a uniform random number in [0, 1). Without a known remaining time (nullopt)
// the lease may be a whole `lease` long. Pure: table-tested.
std::chrono::milliseconds lease_held_requeue_delay(std::optional<std::chrono::milliseconds> remaining,
                                                   std::chrono::milliseconds lease,
                                                   std::chrono::milliseconds floor,
                                                   std::chrono::milliseconds cap, double unit) noexcept;

// `window`: how long a key is trusted for replay (configurable for tests; same_key_window in production).
existing_action decide_existing(const ledger_record& rec, const billing_event& ev, sys_time now,
                                std::chrono::seconds window = same_key_window);

// For a pending row whose lease this worker has just taken: re-send under the same key (recover_same_key:
// Stripe replays a first success) only while Stripe still remembers the key and no 5xx/timeout left the
// outcome open; otherwise list the customer's charges first (recover_search).
existing_action recovery_mode(const ledger_record& rec, sys_time now,
                              std::chrono::seconds window = same_key_window);

}  // namespace cg::billing
