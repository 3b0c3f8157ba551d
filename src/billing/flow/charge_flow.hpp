// The per-message billing flow (docs/design.md §4): one delivery in, one verdict out (FIN or REQ with a
// delay). Every decision is the charge fsm's (billing/machine/charge_fsm.hpp); this is its driver, which
// runs the fsm's commands against the ledger and Stripe. Transport-agnostic: it knows nothing of NSQ
// sockets; the app maps a `delivery` from an NSQ message, `touch` to TOUCH, and the verdict to FIN / REQ.
//
// Invariants it keeps: Stripe is never called without a committed pending row whose lease this worker holds
// and whose attempt is recorded; a new key generation is only taken after a list of the customer's charges
// shows none carrying the base key; any PostgreSQL error requeues with backoff (never a Stripe call on a
// guess).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "billing/flow/corrections.hpp"
#include "billing/flow/lease_keeper.hpp"
#include "billing/flow/recovery.hpp"
#include "billing/flow/settle_journal.hpp"
#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/decision.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/store/ledger.hpp"
#include "billing/store/settlement_store.hpp"
#include "core/log.hpp"
#include "net/tokens.hpp"
#include "stripe/types.hpp"

namespace cg::stripe {
class client;
}
namespace cg::metrics {
class registry;
}

namespace cg::net {
class turn_budget;
}

namespace cg::billing {

// One delivery of one message, copied out of the transport's buffers.
struct delivery {
    std::string topic;
    std::string channel;
    std::string message_id;  // the NSQ message id as hex text
    std::int32_t attempts = 1;
    std::string body;
};

// "Still working on it": the app extends the message's timeout (NSQ TOUCH). Called on the pipeline's
// executor.
using touch_fn = std::function<void()>;

struct charge_flow_config {
    std::string key_namespace = "chargeguard";
    // How long a pending row stays ours without renewal (database clock), and how often it is renewed (and
    // `touch` called) while Stripe is awaited. The interval must be well under the lease.
    std::chrono::milliseconds lease{60'000};

    std::chrono::milliseconds lease_renew_interval{15'000};
    // REQ delays.
    // Another worker holds the row's lease: the requeue waits until that lease can have expired (its
    // remaining time by the database clock), never less than this, plus jitter.
    std::chrono::milliseconds lease_held_delay{10'000};
    // No REQ delay above this (nsqd refuses one above its --max-req-timeout, 1 h by default).
    std::chrono::milliseconds max_requeue_delay{3'600'000};
    std::chrono::milliseconds retry_same_key_delay{5'000};       // Stripe said "nothing happened, try again"
    std::chrono::milliseconds indeterminate_delay{30'000};       // 5xx / timeout: resolve by search later
    std::chrono::milliseconds stripe_unavailable_delay{30'000};  // the charge search failed
    // A correction whose predecessor (or original charge) has not ended yet waits this long (plus jitter).
    std::chrono::milliseconds correction_wait_delay{30'000};
    // A new key generation waits until no call under the old one has shown life (its attempt recorded, a
    // lease renewal, an in-flight note) for this long: a search can only see the charges of calls that have
    // finished, and Stripe may still be executing a request our client gave up on.
    std::chrono::milliseconds new_key_quiet{300'000};
    backoff postgres_backoff{};  // PostgreSQL errors, by delivery attempt
    // Past this, a pending row's key is not trusted for replay any more (Stripe prunes keys at 24 h).
    std::chrono::seconds same_key_window{billing::same_key_window};
    // The search for an existing charge starts this long before the first attempt (clock skew with Stripe).
    std::chrono::seconds search_slack{default_search_slack};
    // Failpoint for the chaos test only (never set in production; `consume` reads it from the environment
    // variable CHARGEGUARD_TEST_STEP_PAUSE_MS and logs a warning): a random pause in [0, this] after the row
    // is written, after Stripe answers and after the ledger is updated, so the kills of a chaos run land in
    // every window between those steps rather than only in the Stripe call. 0: off.
    std::chrono::milliseconds test_step_pause{0};
    // Group commit: the ledger's statements wait for company up to 1 % of the recent Stripe call time (an
    // exponential average), never longer than this; 0 turns the wait off. A delivery takes two statements,
    // so the wait adds at most ~2 % to its time while Stripe is slow — when batching saves the most.
    std::chrono::microseconds group_commit_linger_max{2'000};
    // "Now" for the decision table (tests move it); leases always use the database clock.
    std::function<sys_time()> now = [] { return std::chrono::system_clock::now(); };
};

// The decision parameters of `cfg`, as the fsms take them (machine::flow_config).
machine::flow_config fsm_config(const charge_flow_config& cfg);

// A statement failed: the step and the error logged, then REQ with the PostgreSQL backoff
// (machine::on_postgres_error). The one rule for a charge and a correction.
verdict postgres_failed(const charge_flow_config& cfg, std::int32_t attempts, const logger& log,
                        const error& e, std::string_view step);

class charge_flow {
  public:
    // `ledger_` and `stripe` must outlive the pipeline; `reg` too when given (metrics are optional). The
    // pipeline runs on the ledger pool's executor (the main loop); the Stripe client hops to its own.
    charge_flow(charge_flow_config cfg, billing::ledger& ledger, stripe::client& stripe, logger log,
                metrics::registry* reg = nullptr);
    ~charge_flow();
    charge_flow(const charge_flow&) = delete;
    charge_flow& operator=(const charge_flow&) = delete;

    // Runs the whole §4 machine for one delivery and returns FIN or REQ(delay) with the reason. Never throws
    // for database, Stripe or payload failures (they are verdicts); throws only on broken invariants (a
    // column of an unexpected type). Call and complete on the ledger pool's executor. Cancellation is not
    // supported while Stripe is awaited (the call is bounded by the client's own timeouts); `touch` may be
    // empty and must stay callable until the coroutine completes.
    net::awaitable<verdict> handle(delivery d, touch_fn touch = {});

    // For a delivery past the transport's max attempts. An attempt count says how often the broker tried,
    // not that the event is poison: the delivery goes through the same machine as handle() (which
    // dead-letters only what can never succeed), logged as an error and counted
    // (chargeguard_billing_past_max_attempts_total) so an operator sees a message that keeps coming back.
    // Same executor and lifetime rules as handle().
    net::awaitable<verdict> give_up(delivery d, touch_fn touch = {});

    // For a ledger row no delivery works on any more (the sweeper, sweeper.hpp): the machine a redelivery of
    // its event runs, from the decision on the existing row on — lease held → requeue verdict; expired →
    // take the lease with the ledger's take-lease statement (so a live delivery of the same key, or another
    // sweeper, is excluded exactly as a second redelivery would be) and RECOVER (same key inside Stripe's
    // window, the charge search after it) — without the pre-flight insert. `d` stands in for the message:
    // its id is written to the row with the lease and names dead letters, its body (to_json of `ev`) is what
    // a dead letter keeps. `rec` is the row as read with its lease (lease_remaining by the database clock);
    // its key must be this pipeline's key for `ev` (std::invalid_argument otherwise). The verdict is not
    // counted in chargeguard_billing_messages_total (the sweeper counts its own). Same executor and lifetime
    // rules as handle().
    net::awaitable<verdict> resume(delivery d, billing_event ev, ledger_record rec);

    // For a correction revision left pending that no delivery works on any more (the sweeper): the
    // corrections machine (corrections.hpp) for `ev` exactly as a redelivery of its message runs it — the
    // revision's expired lease taken in cg_correction_admit (a live delivery or another sweeper holding it
    // makes this a lease-held requeue verdict), then each pending move by the same-key / search rules. `d`
    // stands in for the message (its body is the revision's raw_body). `ev` must be a correction whose base
    // key under this pipeline's namespace is `base` (std::invalid_argument otherwise). Not counted in
    // chargeguard_billing_messages_total. Same executor and lifetime rules as handle().
    net::awaitable<verdict> resume_correction(delivery d, billing_event ev, std::string base);

    const charge_flow_config& config() const noexcept { return cfg_; }
    // Whether most of the last deliveries (an average over about the last eight) started a Stripe call:
    // the next ones likely will too (charging, not replaying duplicates). False before the first delivery.
    // Same executor as handle().
    bool deliveries_call_stripe() const noexcept { return stripe_share_ >= 0.5; }
    // The settles this pipeline's deliveries wrote lately (the sweeper re-applies the ones a failover lost).
    const settle_journal& journal() const noexcept { return journal_; }
    billing::ledger& ledger_ref() noexcept { return ledger_; }

  private:
    struct run;
    struct metrics_set;

    net::awaitable<verdict> handle_delivery(delivery d, touch_fn touch, bool past_max_attempts);
    // The driver: runs the fsm's commands (billing/machine/charge_fsm.hpp) until it gives the verdict.
    net::awaitable<verdict> drive(run& r, const machine::fsm_input& first);
    net::awaitable<machine::fsm_input> execute(run& r, machine::charge_fsm& fsm, const machine::command& c);
    net::awaitable<machine::fsm_input> preflight(run& r, machine::charge_fsm& fsm);
    net::awaitable<machine::fsm_input> run_command(run& r, machine::charge_fsm& fsm,
                                                   const machine::command& c);
    net::awaitable<machine::fsm_input> call_stripe(run& r, machine::charge_fsm& fsm,
                                                   const machine::command& c);
    net::awaitable<machine::fsm_input> settle(run& r, machine::charge_fsm& fsm, const machine::command& c);
    net::awaitable<void> test_pause();
    net::awaitable<void> renew_once(run& r, machine::charge_fsm& fsm);
    verdict count(verdict v);
    void note_stripe_time(std::chrono::steady_clock::duration took);

    charge_flow_config cfg_;
    machine::flow_config fsm_cfg_;  // cfg_'s decision parameters, as the fsm takes them
    billing::ledger& ledger_;
    stripe::client& stripe_;
    logger log_;
    std::unique_ptr<metrics_set> metrics_;
    std::unique_ptr<settlement_store> settlements_;  // on ledger_'s pool
    std::mt19937_64 rng_{std::random_device{}()};    // requeue jitter; used on the pipeline's executor only
    double stripe_time_avg_us_ = 0;                  // exponential average of Stripe call times (µs)
    double stripe_share_ = 0;  // exponential average of deliveries that started a Stripe call (0 or 1 each)
    net::turn_budget* turns_ = nullptr;  // the main loop's (net/turn_budget.hpp), found on first use
    settle_journal journal_;

    // Events with a revision (corrections.hpp); after cfg_ and ledger_, which it refers to.
    std::unique_ptr<billing::corrections> corrections_;
};

}  // namespace cg::billing
