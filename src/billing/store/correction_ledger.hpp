// The corrections ledger's SQL (migration 0018, docs/design.md §4a): billing_corrections (one row per
// revision of a period) and billing_correction_moves (one row per Stripe call a revision makes), on a
// pg::pool. The revision's lease works as billing_records' does (ledger.hpp): lease_until by the database
// clock and a lease_epoch that moves on with every write of lease_until, so a worker whose lease was taken
// over cannot record an attempt or release the new holder's lease.
//
// Each coroutine runs one statement (the admit step is one function call), completes on the pool's
// executor and passes pg errors through unchanged; the caller requeues with backoff on any of them. The
// pool must outlive every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/decision.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::billing {

// What cg_correction_admit said (see the migration): the action and its detail, the lease epoch when the
// revision is ours ("run"), the remaining lease when another worker holds it, and the revision's difference
// once it started.
struct correction_admission {
    std::string action;
    std::string detail;
    std::int64_t epoch = 0;
    std::chrono::milliseconds lease_remaining{0};
    std::optional<std::int64_t> delta;
};

struct correction_move {
    std::int32_t part = 1;
    std::string kind;  // charge | refund
    std::int64_t amount_cents = 0;
    std::optional<std::string> refund_of;  // a refund's charge
    std::int32_t key_generation = 1;
    std::string status;  // pending | done | declined | failed
    std::optional<std::string> stripe_object_id;
    std::int32_t stripe_attempts = 0;
    std::optional<sys_time> first_stripe_attempt_at;
    std::optional<sys_time> indeterminate_since;
    // How long since the last sign of a Stripe call for this move (its last attempt), by the database clock.
    std::optional<std::chrono::milliseconds> since_last_attempt;

    bool is_refund() const noexcept { return kind == "refund"; }
};

class correction_ledger {
  public:
    explicit correction_ledger(std::shared_ptr<pg::pool> pool) : pool_(std::move(pool)) {}

    // One admit step for the revision `key` of the period `base` (cg_correction_admit).
    net::awaitable<result<correction_admission>> admit(std::string key, std::string base,
                                                       std::int32_t revision, std::int64_t total_cents,
                                                       std::string currency, std::string body,
                                                       std::string message_id,
                                                       std::chrono::milliseconds lease);

    // The revision's moves, by part.
    net::awaitable<result<std::vector<correction_move>>> moves(std::string key);

    // Before every Stripe call of a move: its attempt recorded and the revision's lease renewed, only while
    // we hold it (`epoch`) and the move is pending. nullopt: not ours any more — do not call Stripe.
    net::awaitable<result<std::optional<std::int64_t>>> record_attempt(std::string key, std::int32_t part,
                                                                       std::int64_t epoch,
                                                                       std::chrono::milliseconds lease);

    // While a move's Stripe call is awaited (lease_keeper.hpp): the revision's lease extended and the move's
    // last attempt time moved on (a call in flight holds back a new key generation), only while we hold the
    // lease (`epoch`) — with the statement's deadline the database checks, as the ledger's renewals. The new
    // epoch, or nullopt: not ours any more. errc::timeout when the database saw it past its deadline.
    net::awaitable<result<std::optional<std::int64_t>>> renew_lease(std::string key, std::int32_t part,
                                                                    std::int64_t epoch,
                                                                    std::chrono::milliseconds lease);
    // After the lease was lost, while our call under `generation` is still awaited: the move's last attempt
    // time moved on (no lease needed; it only holds back a new key generation).
    net::awaitable<result<void>> note_in_flight(std::string key, std::int32_t part, std::int32_t generation);

    // A move's end as Stripe (or the search) told it. Only from pending; they do not need the lease (an
    // answer from Stripe is a fact worth recording).
    net::awaitable<result<void>> move_done(std::string key, std::int32_t part, std::string object_id,
                                           std::optional<std::string> payment_intent_id);
    net::awaitable<result<void>> move_ended(std::string key, std::int32_t part, std::string status,
                                            std::string last_error);
    // The answer left the outcome open: indeterminate_since set, the revision's lease released (if ours).
    net::awaitable<result<void>> move_indeterminate(std::string key, std::int32_t part, std::int64_t epoch,
                                                    std::string last_error);
    // Nothing happened: the revision's lease released (if ours), the move's last_error noted.
    net::awaitable<result<void>> release(std::string key, std::int32_t part, std::int64_t epoch,
                                         std::string last_error);
    // key_generation + 1 for a move a search found nowhere at Stripe, while we hold the lease and once no
    // attempt under the old generation is younger than `quiet`. true: bumped; false: not yet (or not ours).
    net::awaitable<result<bool>> bump_generation(std::string key, std::int32_t part, std::int64_t epoch,
                                                 std::int32_t from_generation,
                                                 std::chrono::milliseconds quiet);

    // The revision's end: applied, declined or failed (from pending), the lease dropped.
    net::awaitable<result<void>> finish(std::string key, std::string status, std::string note);

  private:
    std::shared_ptr<pg::pool> pool_;
};

// The key of revision N of the period whose original key is `base`: base + "-r" + N. Its first money move
// is made under this key; a refund that spans more payments makes its further parts under key + "-p" + part
// (part ≥ 2). The original charge's key (revision 0) is `base` itself, unchanged.
std::string correction_key(std::string_view base, std::int32_t revision);
std::string correction_move_key(std::string_view base, std::int32_t revision, std::int32_t part);

}  // namespace cg::billing
