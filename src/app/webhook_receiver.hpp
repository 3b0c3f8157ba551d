// The Stripe webhook endpoint behind `chargeguard webhooks`: verifies each delivery's Stripe-Signature over
// the raw body, records the event once in stripe_webhook_events and applies it to the ledger row it names in
// the same transaction (billing/store/settlement_store.hpp), and answers 2xx only after that transaction
// committed (docs/operating/webhooks.md has the status table).
//
//   oversized body → 413 · unsigned, bad or malformed signature → 400 · stale or future → 400 ·
//   not a JSON event → 400 · an event no table can hold (poison) → recorded as refused, 400 once, then
//   200 to its redeliveries · rendered in another API version than the receiver reads → recorded as
//   refused, 400 · more than max_in_flight being recorded, or no pooled connection free in time while
//   PostgreSQL is up → 503 + Retry-After (busy) · PostgreSQL unavailable or failing → 500 (Stripe retries) ·
//   recorded → 200 · already recorded → 200 (ignored) · other methods → 405 (the router)
//
// A recorded event moves a ledger row only when it is provably that row's payment (billing::link_payment):
// one about another payment is recorded, counted (other_payment) and logged at warn with both ids.
//
// Metrics: chargeguard_webhook_deliveries_total{outcome} (recorded, duplicate, other_payment,
// bad_signature, stale, malformed, poison, wrong_api_version, too_large, busy, error),
// chargeguard_webhook_lag_seconds (received − the event's `created`),
// chargeguard_webhook_events_total{result} (what a recorded event did to the ledger: applied, no_change,
// deferred, other_payment, unconfirmed, unknown_type, unknown_object, unreadable),
// chargeguard_billing_failed_after_processing_total and chargeguard_billing_settlement_anomalies_total.
//
// A refund event (charge.refunded, refund.created, refund.updated, charge.refund.updated)
// also reaches the vault: the reservation that settled the charge or its PaymentIntent takes the payment's
// refunded amount as recorded — each refund once by its id, a failed or canceled one given back
// (vault::store::apply_refund_by_object; the cap room comes back only under the key's refunds_reopen_cap).
// That write follows the event's commit and precedes the 2xx, on the first delivery and on every duplicate:
// it is idempotent (cumulative, never below what it was), so a crash or error between the two leaves the
// event recorded and unacknowledged (500), and Stripe's redelivery, a duplicate, applies it then.
// chargeguard_webhook_vault_refunds_total counts the reservations it touched.
//
// With a declined-row retrier set (`--retry-declined-on-payment-method-change`), an event saying a Stripe
// customer's payment method changed (stripe/payment_method_change.hpp: payment_method.attached, or
// customer.updated whose invoice_settings.default_payment_method changed) retries that customer's declined
// rows in the event's account through the path `retry-declined` takes (app/declined_retry.hpp), recorded
// with who = "webhook:<event id>" and why = the event type. It runs after the event's commit and before the
// 2xx, on the first delivery and on every duplicate: a row this event retried before is never reopened by it
// again (the retry statement's once-per-requester guard), a pending row it reopened is published again (its
// publish may have failed), and a failure answers 500 so that Stripe's redelivery finishes the work. Another
// event while a retry is under way finds the row pending, not declined: nothing is retried twice.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "app/declined_retry.hpp"
#include "billing/store/retry_store.hpp"
#include "billing/store/settlement_store.hpp"
#include "core/log.hpp"
#include "http/router.hpp"
#include "metrics/registry.hpp"
#include "pg/pool.hpp"
#include "stripe/webhook_event.hpp"
#include "stripe/webhook_signature.hpp"
#include "vault/store.hpp"

namespace cg::app {

struct webhook_receiver_config {
    std::string path = "/stripe/webhooks";
    std::vector<std::string> secrets;  // current first, then the previous one during a rotation
    std::chrono::seconds tolerance = stripe::default_webhook_tolerance;
    std::size_t max_body_bytes = 256 * 1024;
    // The API version the receiver reads objects in (the endpoint must be created with it): the same
    // default as --stripe-version.
    std::string api_version = "2024-06-20";
    // Deliveries past the signature check being recorded at once; beyond, 503 with Retry-After (Stripe
    // retries), so callers never queue on the PostgreSQL pool past its waiter bound.
    std::size_t max_in_flight = 64;
    std::chrono::seconds retry_after{5};
};

class webhook_receiver {
  public:
    // `pool` and `reg` must outlive the receiver; it runs on the pool's executor.
    webhook_receiver(webhook_receiver_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                     metrics::registry& reg);

    // Retries declined rows when a customer's payment method changes (above): events published to `topic`
    // through `producer`, open intents cancelled through `stripe`; both must outlive the receiver.
    void retry_declined_with(nsq::producer& producer, stripe::client& stripe, std::string topic);

    // POST <path> → handle(). The receiver must outlive the router (the handler holds `this`).
    http::router routes();
    // Verifies, records and answers one delivery (the table above). Completes on the pool's executor;
    // throws only on a broken invariant (the server answers 500).
    asio::awaitable<http::response> handle(http::request& req);

  private:
    http::response refuse(int status, std::string_view outcome, std::string_view why);
    http::response busy(std::string_view why);
    // A genuinely signed event refused for its content (poison, wrong_api_version): recorded in
    // stripe_webhook_refusals with its reason; `once`: its redeliveries are acknowledged.
    asio::awaitable<http::response> refuse_event(const stripe::webhook_event& ev, const std::string& body,
                                                 std::string_view outcome, std::string reason, bool once);
    bool pool_busy_not_down() const;
    asio::awaitable<http::response> record(const http::request& req, std::int64_t received_unix);
    // The refund an event reports, applied to the vault reservation it settled (see above); false: failed.
    asio::awaitable<bool> refund_vault(const stripe::webhook_event& ev, const billing::payment_fact& f);
    // The declined rows of the customer whose payment method the event changed, retried (see above); false:
    // a retry failed (answer 500).
    asio::awaitable<bool> retry_declined(const stripe::webhook_event& ev, const std::string& body);

    webhook_receiver_config cfg_;
    std::shared_ptr<pg::pool> pool_;
    logger log_;
    billing::settlement_store settlements_;
    vault::store vault_;
    billing::retry_store retries_;
    nsq::producer* retry_producer_ = nullptr;  // null: no automatic retry
    stripe::client* retry_stripe_ = nullptr;
    std::string retry_topic_;
    metrics::family<metrics::Counter>& deliveries_;
    metrics::Histogram& lag_;
    metrics::family<metrics::Counter>& events_;
    metrics::Counter& failed_after_processing_;
    metrics::Counter& anomalies_;
    metrics::Counter& vault_refunds_;
    std::size_t in_flight_ = 0;  // deliveries past the signature check (touched only on the executor)
};

}  // namespace cg::app
