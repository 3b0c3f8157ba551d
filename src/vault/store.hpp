// The vault's SQL (docs/design.md §5, migrations 0003, 0004 and 0008): keys, the atomic find-or-reserve step
// and the state changes of a reservation, the resolver's work list, the audit trail. Every call takes one
// pooled connection for one statement (or one batch) and gives it back.
//
// Executors: call and complete on the pool's executor (the main loop). Errors: pg::errc codes (errc::
// unavailable when PostgreSQL cannot be reached). The pool must outlive every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/bytes.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "pg/types.hpp"

namespace cg::vault {

// What a key was issued with: the same whether it is being issued (new_key) or read back (key_record).
struct key_terms {
    std::string id;
    std::string name;
    bytes secret_hash;
    std::string billing_period;
    std::int64_t cap_cents = 0;
    std::string currency;
    std::vector<std::string> allowed;
};

struct new_key : key_terms {
    std::optional<std::string> expires_at;  // RFC 3339 text; PostgreSQL parses it
    std::string stripe_account{};           // acct_…: the one connected account it may act in; empty: none
};

struct key_record : key_terms {
    std::optional<pg::timestamp> expires_at;
    std::optional<pg::timestamp> revoked_at;
    pg::timestamp created_at{};
    bool usable = false;  // not revoked, not expired (database clock)
    // The connected account (acct_…) the key acts in: the proxy forwards requests carrying exactly this
    // Stripe-Account and refuses others; empty: the platform's own account, and any Stripe-Account refused.
    std::string stripe_account{};
    bool allows(std::string_view op) const;
};

struct key_usage {
    key_record key;
    std::int64_t settled_cents = 0, reserved_cents = 0, uncertain_cents = 0, released_cents = 0;
    // What the key's open cap leases hold and have not yet written as rows (vault_keys.leased_cents).
    std::int64_t leased_cents = 0;
    std::int64_t committed() const { return settled_cents + reserved_cents + uncertain_cents; }
};

enum class reserve_outcome {
    reserved,
    rereserved,
    existing,
    cap_exceeded,
    amount_mismatch,
    key_expired,
    key_unusable
};
std::optional<reserve_outcome> parse_reserve_outcome(std::string_view s);

struct reserve_result {
    reserve_outcome outcome = reserve_outcome::key_unusable;
    std::string state;  // the row's state (existing) or "reserved"
    std::int64_t committed_cents = 0;
    std::int64_t cap_cents = 0;
    bool owner() const {
        return outcome == reserve_outcome::reserved || outcome == reserve_outcome::rereserved;
    }
};

struct reserve_request {
    std::string key_id;
    std::string idempotency_key;
    std::int64_t amount_cents = 0;
    std::string path;
    std::string body;  // as forwarded (no header, no secret)
    std::string customer;
    std::chrono::seconds same_key_window{23 * 3600};
};

// What a proxy learned from Stripe about one of its reservations, written after the client has its answer
// (cg_vault_step, migration 0008): settled, released, or uncertain (due for the resolver after `retry_in`).
struct settlement_request {
    std::string idempotency_key;
    std::string state;                      // "settled", "released", "uncertain"
    std::string object_id;                  // settled: Stripe's object id
    std::string why;                        // released / uncertain: what happened (last_error)
    std::chrono::milliseconds retry_in{0};  // uncertain
};

// A reservation the resolver should look at.
struct spend_row {
    std::string key_id;
    std::string idempotency_key;
    std::int64_t amount_cents = 0;
    std::string state;
    std::string path;
    std::string body;
    std::string customer;
    std::int64_t age_seconds = 0;       // since reserved_at (database clock), when the row was read
    std::int64_t reserved_at_unix = 0;  // for the charge search's created[gte]
    std::int32_t resolve_attempts = 0;
    std::string stripe_account;  // its key's connected account: the resolver searches and re-sends there
    // When the row was read (steady clock, taken before the statement): its age later is age_seconds plus
    // the time since, so a long resolver pass still knows how old the row is.
    std::chrono::steady_clock::time_point read_at{};
};

struct audit_row {
    std::optional<std::string> key_id;
    std::string method;
    std::string path;
    std::optional<std::int64_t> amount_cents;
    std::optional<std::string> idempotency_key;
    std::optional<int> upstream_status;
    std::string outcome;
    double latency_ms = 0;
    std::optional<std::string> request_id;
    std::optional<pg::timestamp> at;  // read back only
};

class store {
  public:
    explicit store(std::shared_ptr<pg::pool> pool) : pool_(std::move(pool)) {}

    // Inserts a key. A primary-key clash (an id already taken) is pg::errc::unique_violation.
    net::awaitable<result<void>> insert_key(new_key k);
    net::awaitable<result<std::optional<key_record>>> find_key(std::string id);
    // Every key (newest first) or one, with what it has spent.
    net::awaitable<result<std::vector<key_usage>>> usage(std::optional<std::string> id = std::nullopt);
    // Sets revoked_at; false when there is no such key or it was revoked already.
    net::awaitable<result<bool>> revoke(std::string id);

    // One key's step (cg_vault_step, migration 0008), the atomic find-or-reserve: applies `settled` (in
    // order), then reserves `rs` (in order), in one statement and one transaction under the key's lock. `rs`
    // may be empty (settlements alone) and so may `settled`. One result per reservation.
    net::awaitable<result<std::vector<reserve_result>>> step(std::string key_id,
                                                             std::vector<settlement_request> settled,
                                                             std::vector<reserve_request> rs);
    // reserved/uncertain → settled for rows of any keys (cg_vault_settle_many, 0009): one statement, no key's
    // lock. `s` is sorted here by (key, Idempotency-Key). Returns the elements (indexes into the sorted `s`)
    // not applied because their row was in another state: those go through step() (a released row's 2xx
    // counts again under the key's lock).
    struct keyed_settlement {
        std::string key_id;
        std::string idempotency_key;
        std::string object_id;
    };
    net::awaitable<result<std::vector<std::size_t>>> settle_many(std::vector<keyed_settlement>& s);
    // reserved/uncertain → settled. False when the row was in neither state. A non-empty
    // `in_flight_status` settles it in flight in the same statement (as mark_in_flight does), so the
    // resolver follows it until Stripe says how it ended; empty keeps a mark made before.
    net::awaitable<result<bool>> settle(std::string key_id, std::string idem, std::string object_id,
                                        std::string in_flight_status = {});
    // reserved/uncertain → released.
    net::awaitable<result<bool>> release(std::string key_id, std::string idem, std::string why);
    // Keeps the row as it is, due again after `retry_in`; counts an attempt.
    net::awaitable<result<void>> defer(std::string key_id, std::string idem, std::string why,
                                       std::chrono::milliseconds retry_in);
    // Rows due: uncertain and due, or reserved and untouched for `stale_reserved` (a proxy died mid-call).
    net::awaitable<result<std::vector<spend_row>>> due(std::chrono::milliseconds stale_reserved, int limit);

    // Payments that settle later (migration 0014). A reservation settled with its payment still in flight
    // (a PaymentIntent processing or requires_capture, a charge pending) keeps counting against the cap
    // until Stripe says how it ended. mark_in_flight records the status it was settled with (any state but
    // released; false: no such row).
    net::awaitable<result<bool>> mark_in_flight(std::string key_id, std::string idem, std::string status);
    // Settled reservations still in flight, not checked for `recheck` (least recently checked first).
    struct in_flight_row {
        std::string key_id;
        std::string idempotency_key;
        std::string object_id;  // pi_… or ch_…
        std::string settled_status;
        std::string stripe_account{};  // its key's connected account: retrieved there
    };
    net::awaitable<result<std::vector<in_flight_row>>> in_flight_due(std::chrono::milliseconds recheck,
                                                                     int limit);
    // How it ended. succeeded: settled for good (no longer in flight). failed: released — nothing was
    // charged, so the cap room comes back (committed_cents drops by the amount, exactly once: only a settled
    // row in flight is released). still: checked now, due again after `recheck`.
    enum class in_flight_end { succeeded, failed, still };
    net::awaitable<result<bool>> end_in_flight(std::string key_id, std::string idem, in_flight_end how,
                                               std::string why);
    // A cancel of a PaymentIntent the vault tagged with `idem` (POST /v1/payment_intents/pi_…/cancel through
    // the proxy). owns_intent: the key holds a reservation under `idem` that is this intent's (settled with
    // it, or with no object recorded yet — a 402 records none). release_canceled: once Stripe canceled the
    // intent nothing moved and nothing can, so the reservation (reserved, uncertain or settled, followed or
    // not) is released and the cap room comes back at once; false when it was released already.
    net::awaitable<result<bool>> owns_intent(std::string key_id, std::string idem, std::string intent_id);
    net::awaitable<result<bool>> release_canceled(std::string key_id, std::string idem, std::string intent_id,
                                                  std::string why);
    // A refund of a settled reservation (cumulative, as Stripe reports amount_refunded; the largest kept):
    // recorded always. Cap room comes back only for a key whose policy says so (vault_keys.
    // refunds_reopen_cap) when the refund is applied: a rise in the refunded amount reopens that rise under
    // `true`, nothing under `false`; room reopened earlier stays reopened after the policy turns false
    // (spend made under it is not an overspend after the fact). Returns the cents given back to the cap in
    // total for the row; nullopt: no settled row.
    net::awaitable<result<std::optional<std::int64_t>>> apply_refund(std::string key_id, std::string idem,
                                                                     std::int64_t refunded_cents);
    // The refunds recorded for a payment (billing/store/settlement_store.hpp: each refund once by its id, a
    // failed or canceled one given back, the charge's amount_refunded for the rest; cg_refunded_cents),
    // set on the settled reservations whose Stripe object is `charge_id` or `payment_intent_id` (empty ones
    // match nothing; vault_spend_object_idx), with apply_refund's policy rule; a fall in the refunded amount
    // takes back the room reopened above it. Idempotent: a redelivered, older or reordered event changes
    // nothing twice. One row per reservation touched: key, Idempotency-Key, its refunded cents and the cents
    // given back to the cap in total for it.
    struct refund_applied {
        std::string key_id;
        std::string idempotency_key;
        std::int64_t refunded_cents = 0;
        std::int64_t reopened_cents = 0;
    };
    net::awaitable<result<std::vector<refund_applied>>> apply_refund_by_object(std::string charge_id,
                                                                               std::string payment_intent_id);
    // Sets a key's refund policy; false: no such key.
    net::awaitable<result<bool>> set_refunds_reopen_cap(std::string key_id, bool reopen);

    // Leases of a key's cap (migration 0025; store_lease.cpp). lease_take takes a new lease (`lease`
    // nullopt) or tops up and renews `holder`'s lease: least(want, the key's free room / 8), nothing when
    // that is below `min`; the lease is renewed to expire `ttl` from the statement either way.
    struct lease_grant {
        std::optional<std::int64_t> lease_id;  // nullopt: none held (none granted, or it was forfeited)
        std::int64_t granted_cents = 0;        // added by this call
        bool usable = false;                   // the key may spend (not revoked, not expired)
    };
    net::awaitable<result<lease_grant>> lease_take(std::string key_id, std::optional<std::int64_t> lease,
                                                   std::string holder, std::int64_t want, std::int64_t min,
                                                   std::chrono::milliseconds ttl);
    // Records spends already made from `lease` as reservation rows, in order (cg_vault_lease_record): one
    // result per element — reserved / rereserved (the row is this spend's: the caller owns it), existing or
    // amount_mismatch (nothing counted: the cents go back to the lease), key_expired (counted without a
    // row). `state` is the row's.
    net::awaitable<result<std::vector<reserve_result>>> lease_record(std::string key_id, std::int64_t lease,
                                                                     const std::vector<reserve_request>& rs);
    // Gives back up to `cents` of what `holder`'s lease holds and has not recorded, closing it when `close`.
    // Returns the cents given back.
    net::awaitable<result<std::int64_t>> lease_return(std::string key_id, std::int64_t lease,
                                                      std::string holder, std::int64_t cents, bool close);
    // A key's open leases, oldest first (the operator's view: `vault show`, `vault forfeit-lease`).
    struct open_lease {
        std::int64_t id = 0;
        std::string holder;
        std::int64_t granted_cents = 0, spent_cents = 0;
        std::int64_t held() const { return granted_cents - spent_cents; }
        pg::timestamp taken_at{}, expires_at{};
        bool expired = false;  // expires_at has passed by PostgreSQL's clock: no holder renews it
    };
    net::awaitable<result<std::vector<open_lease>>> open_leases(std::string key_id);
    // An operator's forfeit of an open lease of `key_id` (cg_vault_lease_forfeit): `keep_cents` of what it
    // holds stay counted, the rest goes back to the cap. Unless `force`, only a lease past its expiry,
    // checked in the forfeit's transaction under the key's lock (no renewal between). nullopt: no such open
    // lease (or, unforced, not expired).
    struct forfeited {
        std::int64_t given_back_cents = 0, kept_cents = 0;
    };
    // Cents held by open leases past their expiry, every key: no holder renews them (a dead proxy's,
    // stranded until forfeited). Reads only the open leases (the partial index of 0025).
    net::awaitable<result<std::int64_t>> expired_lease_cents();
    net::awaitable<result<std::optional<forfeited>>> forfeit_lease(std::string key_id, std::int64_t lease,
                                                                   std::int64_t keep_cents, bool force);

    // One multi-row INSERT.
    net::awaitable<result<void>> write_audit(std::vector<audit_row> rows);
    // A key's last `limit` audit rows, newest first.
    net::awaitable<result<std::vector<audit_row>>> recent_audit(std::string key_id, int limit);

    // Number of vault_spend rows per state (for the reservations gauge).
    net::awaitable<result<std::vector<std::pair<std::string, std::int64_t>>>> reservations_by_state();

  private:
    std::shared_ptr<pg::pool> pool_;
};

}  // namespace cg::vault
