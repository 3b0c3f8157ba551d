// A deterministic simulator of the charge flow (docs/design.md §4; docs/testing.md "The simulator"): several
// sidecars run the charge fsm that ships (billing/machine/charge_fsm.hpp, the machine billing::charge_flow
// drives), and the operator's retry-declined, against in-memory models of the
// ledger (its statements' semantics), nsqd (at-least-once, timeouts, requeues, re-publication), Stripe (the
// 24 h idempotency cache, a 500 saved after the create, 429, stalls, late execution, bank debits pending then
// succeeded or failed, list lag, webhooks duplicated, reordered, lost and foreign) and the process (a crash
// between any two steps, lease expiry), with the spend-cap vault proxy between the sidecars and Stripe,
// driven by one seeded scheduler on a simulated clock. The rules are the project's own pure code
// (billing/machine/charge_fsm, billing/machine/decision, billing/machine/outcome, billing/machine/settlement,
// billing/machine/key, billing/machine/event, stripe/outcome, stripe/fact, vault/cap, vault/policy,
// vault/refusals): the simulator only models what they talk to. No Asio, no sockets, no wall clock: a seed
// replays bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cg::sim {

// The safeguards of the charge flow, each removable to show the simulator catches its absence.
enum class safeguard {
    write_before_call,        // the row and its first attempt are committed before Stripe is called
    lease_renewal,            // the lease is renewed (or the call noted in flight) while a call is awaited
    search_before_new_key,    // a new key generation only after a search found no payment with the key
    same_key_window,          // the same key is re-sent only within 23 h of the first attempt
    quiet_period,             // a new generation only once no call under the old one showed life for a while
    same_payment,             // a fact moves a row only when its ids are the row's (settlement's rule)
    in_flight_not_charged,    // a pending charge is processing, never charged, until Stripe says it settled
    not_tried_not_declined,   // a PaymentIntent Stripe never tried (requires_confirmation) is no decline
    failed_debit_processing,  // a debit found failed goes processing (then failed_after_processing), not
                              // declined
    cancel_before_retry,      // retry-declined cancels the intent a decline left open before reopening
    sweeper,                  // a pending row no message brings back is recovered by the sweeper
    replay_new_generation,    // a dead letter's replay of a debit that failed reopens under a new key
                              // generation (reopen_for_replay), so Stripe does not replay the failure
    cap_reservation,          // the vault proxy reserves each create against its period's cap before
                              // forwarding it (cg_vault_step)
    retry_counted_once,  // a retry with the same idempotency key finds its reservation: not counted again
    follow_until_ended,  // the vault follows every settled payment that may still move money but has not,
                         // and a cancel through it releases the intent's reservation
};
inline constexpr safeguard all_safeguards[] = {
    safeguard::write_before_call,
    safeguard::lease_renewal,
    safeguard::search_before_new_key,
    safeguard::same_key_window,
    safeguard::quiet_period,
    safeguard::same_payment,
    safeguard::in_flight_not_charged,
    safeguard::not_tried_not_declined,
    safeguard::failed_debit_processing,
    safeguard::cancel_before_retry,
    safeguard::sweeper,
    safeguard::replay_new_generation,
    safeguard::cap_reservation,
    safeguard::retry_counted_once,
    safeguard::follow_until_ended,
};
std::string_view to_string(safeguard s) noexcept;

struct config {
    std::uint64_t seed = 1;
    int events = 12;                          // billing events (one key each)
    int sidecars = 3;                         // consume processes
    std::int64_t fault_ms = 6 * 3600 * 1000;  // faults happen in [0, fault_ms); then the world settles
    std::vector<safeguard> removed;           // safeguards switched off
    bool trace = false;                       // keep the schedule (printed for a failing seed)
    bool failovers = true;                    // PostgreSQL fails over now and then, losing its last commits
    // The vault resolver's search sees Stripe's list lag too. Off: its lists show Stripe's writes at once,
    // as src/vault/resolver.cpp assumes (with the lag a search can miss a charge a saved 5xx hid and release
    // its room: the cap is exceeded, seed 125).
    bool resolver_list_lag = false;
    // The vault resolver replays a row for as long as resolver.cpp did before its replay window (the 23 h
    // window). Off: only while the row is younger than half the flow's quiet period (the proxy's default
    // --replay-window), searched after. With the 23 h window a replay deferred by 429s past the quiet period
    // runs after the flow searched, found nothing and charged under a new key generation: two payments
    // (seed 31776).
    bool resolver_replay_late = false;
    // The faults kept (their numbers in firing order, sorted); nullopt: all. A shrunk schedule.
    std::optional<std::vector<std::uint32_t>> keep_faults;
};

struct run_result {
    std::uint64_t seed = 0;
    std::vector<std::string> violations;  // empty: every invariant held
    std::uint64_t deliveries = 0;         // NSQ deliveries to a sidecar
    std::uint64_t steps = 0;              // scheduled actions run
    std::uint64_t stripe_creates = 0;     // create requests that reached Stripe
    std::uint64_t faults = 0;             // faults that fired (numbered 1..faults)
    std::uint64_t lost_commits = 0;       // commits the failovers rolled back
    std::uint64_t swept = 0;              // rows the sweepers ran through the fsm
    std::uint64_t leases_ended = 0;       // leases unwritten since a failover that its sweeps ended
    std::uint64_t replays = 0;            // dead letters the operator replayed
    std::uint64_t cap_refusals = 0;       // creates the vault refused (spend_cap_exceeded)
    std::uint64_t upstream_bugs = 0;      // events the upstream bug published
    std::uint64_t valid_cap_blocked = 0;  // valid events the cap refused (each refusal one it owed)
    std::uint64_t digest = 0;             // a hash of the whole schedule: equal digests, equal runs
    std::vector<std::string> schedule;    // with config::trace
};

run_result run(const config& c);

// A failing schedule shrunk (shrink.cpp): the faults kept (config::keep_faults replays it), how many fired
// in the run it came from, its run (traced; still failing unless the first run did not fail), and its faults,
// each with the step that followed it.
struct shrunk {
    std::vector<std::uint32_t> kept;
    std::uint64_t original = 0;
    run_result result;
    std::vector<std::string> schedule;
    int runs = 0;
};
shrunk shrink(const config& failing, const std::function<run_result(const config&)>& run_fn,
              int max_runs = 300);
// A correction revision's flow (tests/sim/corrections.cpp): config::events / 2 charged periods, each
// corrected once (a partial refund, or an extra charge), with its own random stream.
run_result run_corrections(const config& c);

}  // namespace cg::sim
