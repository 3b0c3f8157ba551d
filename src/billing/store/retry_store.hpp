// Retrying a declined ledger row once the customer's payment method is fixed (`chargeguard retry-declined`,
// docs/operating/runbook.md). A decline is final for the pipeline: a re-published event meets a `declined`
// row and is finished as a duplicate. A retry reopens the row under a new key generation — the same
// mechanism as the replay of a payment that failed after processing (ledger::reopen_for_replay) — and records
// the retry in billing_retries (migration 0022) in the same statement: who asked, why, when, the generation
// it charges under and the payment the attempt before it made. The redelivery (or the sweeper) then charges
// the row under the new key, once, by the ledger's ordinary rules.
//
// Why a new generation: Stripe saved the declined answer under the old idempotency key and replays it for 24
// hours, so the same key would only be declined again. Why this is still at most one success: only a
// `declined` row is reopened (a row lock decides between two retries at once: the second finds it pending
// and reopens nothing), the old generation's payment already ended (a failed charge; an intent still open
// is cancelled first, see app/declined_retry.hpp), and the new generation is charged by the lease
// protocol every other charge goes through. The old payment's ids leave the row (its late events then name
// another payment) and stay here; the recovery search skips them (superseded_payments), so a crash after the
// new call never reads the old decline as the new generation's answer.
//
// Every coroutine acquires a connection from the pool, runs one statement and gives it back; errors are pg
// errors passed through. Completes on the pool's executor; the pool must outlive every call.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/decision.hpp"
#include "billing/machine/event.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::billing {

// A ledger row as a retry needs it: the event it charges (rebuilt from the row's stored fields, migration
// 0011) and the last answer.
struct retry_candidate {
    std::string key;
    billing_event event;
    record_status status = record_status::pending;
    std::int32_t key_generation = 1;
    std::optional<std::string> charge_id;
    std::optional<std::string> payment_intent_id;
    std::optional<std::string> last_error;
};

// One retry as recorded.
struct retry_record {
    std::int64_t id = 0;
    std::string key;
    std::int32_t generation = 0;
    std::string requested_at;  // as PostgreSQL prints timestamptz
    std::string requested_by;
    std::string reason;
    std::string previous_status;
    std::optional<std::string> previous_charge_id;
    std::optional<std::string> previous_payment_intent_id;
    std::optional<std::string> previous_error;
};

class retry_store {
  public:
    explicit retry_store(std::shared_ptr<pg::pool> pool) : pool_(std::move(pool)) {}

    // The row with this key.
    net::awaitable<result<std::optional<retry_candidate>>> by_key(std::string key);
    // The row of (customer, period, account; empty account: the platform's).
    net::awaitable<result<std::optional<retry_candidate>>> by_customer(std::string customer,
                                                                       std::string period,
                                                                       std::string stripe_account);
    // Every declined row of the period, by key.
    net::awaitable<result<std::vector<retry_candidate>>> declined_in_period(std::string period);
    // Every declined row of a Stripe customer (stripe_customer_id, in the account; empty: the platform's),
    // every period, by key; and its pending rows whose current generation `by` reopened (a retry whose
    // publish may not have happened: published again).
    net::awaitable<result<std::vector<retry_candidate>>> declined_of_stripe_customer(
        std::string stripe_customer, std::string stripe_account, std::string by);

    // Reopens a `declined` row: pending, key_generation + 1, no lease, no open answer, the attempt window
    // restarted (the redelivery charges under the new key at once), the old payment's ids cleared; and
    // records the retry. nullopt: the row is not declined (any more: another retry reopened it first, or it
    // was never declined) and nothing was written. `once_per_requester`: nor when `by` retried the row
    // before (a webhook event retries a row once, however often it is delivered).
    net::awaitable<result<std::optional<retry_record>>> reopen_declined(std::string key, std::string by,
                                                                        std::string reason,
                                                                        bool once_per_requester = false);
    // The declined row's open PaymentIntent succeeded after all (the customer authenticated it): the row is
    // charged by it. Only while the row is declined with exactly this intent. False: it was not.
    net::awaitable<result<bool>> charged_by_its_intent(std::string key, std::string payment_intent_id,
                                                       std::string charge_id);

    // Every retry of the row, oldest first.
    net::awaitable<result<std::vector<retry_record>>> retries_of(std::string key);
    // The ids (ch_…, pi_…) of the payments earlier attempts of the row made: never the current generation's.
    net::awaitable<result<std::vector<std::string>>> superseded_payments(std::string key);

  private:
    std::shared_ptr<pg::pool> pool_;
};

}  // namespace cg::billing
