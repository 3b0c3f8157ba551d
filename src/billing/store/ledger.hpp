// The billing ledger's SQL (DESIGN.md §4, §5): every statement the state machine runs against
// billing_records and dead_letters, in one place, on a pg::pool.
//
// Leases use the database clock (now()) only: lease_until is the lease's expiry. Holding a lease means
// knowing the row's lease_epoch as this worker last wrote it (a `lease_token`): every statement that writes
// lease_until also moves lease_epoch forward by one (migration 0007), and every statement that needs the
// lease compares the epoch (`lease_epoch = $token`), so a worker whose lease expired and was taken over
// cannot renew, record an attempt, bump the generation or release someone else's lease. A token is unique per
// row: the epoch only ever grows, whatever the clock did (two leases written within one microsecond still
// differ).
//
// Every function acquires a connection from the pool, runs one statement (or one atomic batch) and gives it
// back. The two hot writes of a fresh event — the pre-flight insert and the settle of a charged or declined
// (or cap-blocked) row — go through group commit (ledger_batch.hpp): concurrent callers share one statement
// and one transaction, and each resumes only once that transaction committed. Errors are pg errors passed
// through unchanged (errc::unavailable when PostgreSQL is unreachable, connection_lost, timeout, …): the
// pipeline requeues with backoff on any of them. Each coroutine completes on the pool's executor (call it
// there: the main loop); cancelling it cancels the statement (the connection is then discarded). The pool
// must outlive every call; arguments are copied into the coroutine frame.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "billing/machine/decision.hpp"
#include "billing/machine/event.hpp"
#include "billing/store/ledger_batch.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "pg/rows.hpp"
#include "pg/types.hpp"

namespace cg::billing {

// A row's stored columns, in the order every whole-row statement selects them first ("key, customer_id, …,
// stripe_attempts": 13 columns), and their decoding into a record (lease_remaining and lease_epoch, which
// the ledger's statements add after them, left unset). For readers with their own extra columns, such as
// reconcile.
const std::string& stored_record_columns();
ledger_record decode_stored_record_columns(const pg::rows& r, std::size_t i);

// The row's lease_epoch as this worker wrote it last; see above.
using lease_token = std::int64_t;

// What the pre-flight insert writes.
struct new_record {
    std::string key;  // base key
    billing_event event;
    std::string nsq_message_id;
    std::int32_t nsq_attempts = 0;
    // The namespace `key` was computed in (base_key); the sweeper selects its own sidecar's rows by it.
    std::string key_namespace{};
};

struct preflight_result {
    bool inserted = false;  // true: the row is ours, pending, leased (record.lease_epoch is the token)
    // The inserted row, or the existing row. On a conflict with UNIQUE (customer_id, billing_period) under a
    // different key (another key namespace computed it) this is that row: record.key differs from the key.
    ledger_record record;
};

// After recording a Stripe attempt: the generation to charge under and the renewed lease.
struct attempt_record {
    std::int32_t key_generation = 1;
    std::int32_t stripe_attempts = 0;
    lease_token lease;
};

// What bump_generation did.
struct bump_result {
    std::optional<std::int32_t> generation;  // bumped to this one
    std::chrono::milliseconds wait{0};       // not bumped: a call under the old generation may be in flight
};

struct dead_letter {
    std::string topic;
    std::string channel;
    std::string nsq_message_id;  // hex text
    std::int32_t attempts = 0;
    std::string raw_body;
    std::string reason;
    std::optional<std::string> billing_key;
};

struct ledger_options {
    batch_options batch;
    // Called with "preflight" or "settle" and the row count of each group-commit statement (metrics).
    std::function<void(std::string_view statement, std::size_t rows)> on_batch;
};

// What the ledger's batchers did so far.
struct ledger_batch_counters {
    batch_counters preflight;
    batch_counters settle;
};

class ledger {
  public:
    explicit ledger(std::shared_ptr<pg::pool> pool, ledger_options opts = {});
    ~ledger();

    // INSERT … status='pending', lease_until=now()+lease ON CONFLICT DO NOTHING RETURNING; on a conflict,
    // the existing row by key, else by (customer_id, billing_period).
    net::awaitable<result<preflight_result>> preflight(new_record rec, std::chrono::milliseconds lease);

    // The row with this key, if any.
    net::awaitable<result<std::optional<ledger_record>>> find(std::string key);

    // Takes the lease of a pending row whose lease expired (by the database clock), atomically; records the
    // delivery that took it. nullopt: not pending, or someone holds the lease.
    net::awaitable<result<std::optional<ledger_record>>> take_expired_lease(std::string key,
                                                                            std::chrono::milliseconds lease,
                                                                            std::string nsq_message_id,
                                                                            std::int32_t nsq_attempts);

    // Extends our lease to now()+lease. nullopt: the lease is not ours any more (expired and taken, or the
    // row settled).
    net::awaitable<result<std::optional<lease_token>>> renew_lease(std::string key, lease_token held,
                                                                   std::chrono::milliseconds lease);

    // Before every Stripe call: stripe_attempts+1, first_stripe_attempt_at = coalesce(…, now()), and the
    // lease renewed to now()+lease (a fresh lease for the call). nullopt: we do not hold the lease: do not
    // call Stripe.
    net::awaitable<result<std::optional<attempt_record>>> record_attempt(std::string key, lease_token held,
                                                                         std::chrono::milliseconds lease);

    // Final states. Each applies only to a pending row (true) — false means another worker settled it first.
    // They do not require the lease: an answer from Stripe is a fact worth recording even if our lease
    // lapsed. `payment_intent_id`: the PaymentIntent of an event charged through one (its latest_charge is
    // the charge id).
    net::awaitable<result<bool>> mark_charged(std::string key, std::string charge_id,
                                              std::optional<std::string> payment_intent_id = std::nullopt);
    net::awaitable<result<bool>> mark_declined(std::string key, std::optional<std::string> charge_id,
                                               std::string last_error,
                                               std::optional<std::string> payment_intent_id = std::nullopt);
    // Stripe answered but the money has not moved (an intent processing or requires_capture, a charge
    // pending): status=processing with the ids, the status seen and the delivery (topic, channel, message
    // id, body) a later failure's dead letter carries; the lease is dropped. Only from pending (false:
    // another worker settled it first). settlement_store then follows the row to its end.
    net::awaitable<result<bool>> mark_processing(std::string key, std::optional<std::string> charge_id,
                                                 std::optional<std::string> payment_intent_id,
                                                 std::string stripe_status, dead_letter delivery);
    // Final with a dead letter, in one transaction (so a crash between the two cannot lose the letter).
    net::awaitable<result<bool>> mark_cap_blocked(std::string key, std::string last_error,
                                                  dead_letter letter);
    net::awaitable<result<bool>> mark_conflict(std::string key, std::string last_error, dead_letter letter);
    net::awaitable<result<bool>> mark_failed(std::string key, std::string last_error, dead_letter letter);

    // Stripe's answer left the outcome open: indeterminate_since = coalesce(…, now()) and last_error on the
    // pending row (even if our lease lapsed: it steers recovery to search first), and our lease released so a
    // redelivery can RECOVER at once. false: the lease was not ours (or the row is no longer pending).
    net::awaitable<result<bool>> mark_indeterminate(std::string key, lease_token held,
                                                    std::string last_error);
    // Keeps the row pending and releases the lease (Stripe said nothing happened; retry later). false: not
    // ours.
    net::awaitable<result<bool>> release_lease(std::string key, lease_token held, std::string last_error);

    // key_generation+1 (only from `from_generation`, only while we hold the lease), clearing
    // indeterminate_since: the open answer belonged to the old key, and a search just showed no charge for
    // it — but only once no call under the old generation has shown life for `quiet` (its attempt, its
    // renewals, note_in_flight): a call still in flight could charge after the search looked. `generation`:
    // the new one; else `wait` > 0 while a call may be in flight; neither when the lease or generation moved.
    net::awaitable<result<bump_result>> bump_generation(std::string key, lease_token held,
                                                        std::int32_t from_generation,
                                                        std::chrono::milliseconds quiet);
    // "My Stripe call under `generation` is still awaited", from a worker whose lease was taken over: holds
    // back a new generation (see bump_generation) without touching the lease. false: the row moved on.
    net::awaitable<result<bool>> note_in_flight(std::string key, std::int32_t generation);

    // Puts a `failed`, `cap_blocked` or `failed_after_processing` row back to pending (no lease,
    // indeterminate_since set, last_error = `why`), so the replay of its dead letter charges it once its
    // cause is fixed: the redelivery searches Stripe first and charges under a new key generation only if no
    // charge carries the key. A row that failed after processing goes straight to a new key generation
    // instead (Stripe said how the old one ended; its failed charge carries the key, so a search would read
    // it as a decline): key_generation + 1, no open answer, the failed payment's ids cleared (its late events
    // then name another payment), and the attempt window restarted so the redelivery charges under the new
    // key at once. Returns the status it had, or nullopt when the row is in any other state (or absent) and
    // was left alone.
    net::awaitable<result<std::optional<record_status>>> reopen_for_replay(std::string key, std::string why);

    // Inserts a dead letter unless one with the same nsq_message_id and reason exists (NSQ redelivered a
    // message whose FIN was lost). Serialised per message id by a transaction-scoped advisory lock, so two
    // concurrent deliveries of one message cannot both insert. Returns true when a letter was inserted.
    net::awaitable<result<bool>> add_dead_letter(dead_letter letter);

    const std::shared_ptr<pg::pool>& pool() const noexcept { return pool_; }
    ledger_batch_counters batch_counters() const;
    // How long a group-commit statement that found a free slot waits for more rows (batch_options.linger);
    // the pipeline keeps it at 1 % of the recent Stripe call time. Main executor only.
    void set_linger(std::chrono::microseconds wait) noexcept { *linger_ = wait; }
    std::chrono::microseconds linger() const noexcept { return *linger_; }

    // The batchers (ledger.cpp).
    struct batchers;

  private:
    net::awaitable<result<bool>> settle(std::string key, record_status status,
                                        std::optional<std::string> charge_id,
                                        std::optional<std::string> last_error,
                                        std::optional<dead_letter> letter,
                                        std::optional<std::string> payment_intent_id = std::nullopt);

    std::shared_ptr<pg::pool> pool_;
    ledger_options opts_;
    std::shared_ptr<std::chrono::microseconds> linger_ = std::make_shared<std::chrono::microseconds>(0);
    std::shared_ptr<batchers> batch_;
};

}  // namespace cg::billing
