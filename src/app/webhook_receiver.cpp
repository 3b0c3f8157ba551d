#include "app/webhook_receiver.hpp"

#include "stripe/webhook_event.hpp"

namespace cg::app {
namespace {

// From a retry within a second to Stripe's three days of redeliveries.
const prometheus::Histogram::BucketBoundaries& webhook_lag_buckets() {
    static const prometheus::Histogram::BucketBoundaries b{0.5, 1,   2,    5,     10,    30,    60,
                                                           300, 900, 3600, 21600, 86400, 259200};
    return b;
}

std::int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

http::response webhook_json(int status, std::string body) {
    return http::make_response(status, std::move(body), "application/json");
}

// The outcome label of a refused signature: a good signature outside the time window is a replay or a
// clock problem (stale), everything else is one nobody holding the secret made (bad_signature).
std::string_view signature_outcome(stripe::signature_status s) {
    using st = stripe::signature_status;
    return s == st::stale || s == st::future ? "stale" : "bad_signature";
}

}  // namespace

webhook_receiver::webhook_receiver(webhook_receiver_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                                   metrics::registry& reg)
    : cfg_(std::move(cfg)),
      pool_(std::move(pool)),
      log_(std::move(log)),
      settlements_(pool_),
      vault_(pool_),
      deliveries_(
          reg.counter("chargeguard_webhook_deliveries_total",
                      "Stripe webhook deliveries by outcome (recorded, duplicate, bad_signature, stale, "
                      "malformed, too_large, error)")),
      lag_(reg.histogram("chargeguard_webhook_lag_seconds",
                         "Time from a Stripe event's creation to its first recorded delivery")
               .Add({}, webhook_lag_buckets())),
      events_(
          reg.counter("chargeguard_webhook_events_total",
                      "Recorded Stripe events by what they did to the ledger (applied, no_change, deferred, "
                      "other_payment, unknown_type, unknown_object, unreadable)")),
      failed_after_processing_(
          reg.counter("chargeguard_billing_failed_after_processing_total",
                      "Payments that failed after processing (dead-lettered; a replay charges again)")
              .Add({})),
      anomalies_(
          reg.counter("chargeguard_billing_settlement_anomalies_total",
                      "Stripe facts chargeguard never asks for (money taken for a row recorded declined or "
                      "failed, success after a recorded failure)")
              .Add({})),
      vault_refunds_(reg.counter("chargeguard_webhook_vault_refunds_total",
                                 "Vault reservations a refund event (charge.refunded, refund.*, "
                                 "charge.refund.updated) was applied to (deliveries and their duplicates)")
                         .Add({})) {
    for (const char* r : {"applied", "no_change", "deferred", "other_payment", "unknown_type",
                          "unknown_object", "unreadable"})
        events_.Add({{"result", r}});
    // Every outcome exists from the start, so a rate() over a refused outcome works before the first one.
    for (const char* o :
         {"recorded", "duplicate", "bad_signature", "stale", "malformed", "too_large", "error"})
        deliveries_.Add({{"outcome", o}});
}

http::router webhook_receiver::routes() {
    http::router r;
    r.add("POST", cfg_.path, [this](http::request& req) { return handle(req); });
    return r;
}

http::response webhook_receiver::refuse(int status, std::string_view outcome, std::string_view why) {
    deliveries_.Add({{"outcome", std::string(outcome)}}).Increment();
    log_.warn("webhook delivery refused", {{"status", status}, {"outcome", outcome}, {"reason", why}});
    return webhook_json(status, R"({"error":{"message":"refused"}})");
}

asio::awaitable<http::response> webhook_receiver::handle(http::request& req) {
    if (req.body.size() > cfg_.max_body_bytes)
        co_return refuse(413, "too_large", "body over --max-body-bytes");
    const auto now = unix_now();
    auto header = req.headers.get("Stripe-Signature");
    auto verdict = stripe::verify_signature(header.value_or(""), req.body, cfg_.secrets, now, cfg_.tolerance);
    if (verdict.status == stripe::signature_status::no_secret)
        throw std::logic_error("webhook receiver started without a secret");
    if (!verdict.ok())
        co_return refuse(400, signature_outcome(verdict.status),
                         std::string(stripe::to_string(verdict.status)) + ": " + verdict.detail);
    co_return co_await record(req, now);
}

// Records and applies the event in one transaction (billing/settlement_store.hpp), then answers. Any failure
// before the commit answers 500 so that Stripe delivers again; nothing of the event is then kept, and the
// redelivery records and applies it as if it were the first.
asio::awaitable<http::response> webhook_receiver::record(const http::request& req,
                                                         std::int64_t received_unix) {
    auto ev = stripe::parse_webhook_event(req.body);
    if (!ev) co_return refuse(400, "malformed", ev.err().message);
    auto rec = co_await settlements_.record_event(*ev, req.body);
    if (!rec) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        log_.error("webhook not recorded", {{"event", ev->id}, {"error", rec.err().describe()}});
        co_return webhook_json(500, R"({"error":{"message":"not recorded, retry"}})");
    }
    bool refunded = co_await refund_vault(*ev, rec->fact);
    if (!refunded) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        co_return webhook_json(500, R"({"error":{"message":"refund not applied to the vault, retry"}})");
    }
    if (rec->duplicate) {
        deliveries_.Add({{"outcome", "duplicate"}}).Increment();
        log_.info("webhook duplicate ignored", {{"event", ev->id}, {"type", ev->type}});
        co_return webhook_json(200, R"({"received":true,"duplicate":true})");
    }
    deliveries_.Add({{"outcome", "recorded"}}).Increment();
    events_.Add({{"result", rec->outcome}}).Increment();
    lag_.Observe(static_cast<double>(std::max<std::int64_t>(0, received_unix - ev->created)));
    const std::string key = rec->row ? rec->row->key : std::string();
    log_.info("webhook recorded", {{"event", ev->id},
                                   {"type", ev->type},
                                   {"object", ev->object_id},
                                   {"result", rec->outcome},
                                   {"billing_key", key},
                                   {"status", rec->row ? billing::to_string(rec->row->after.status) : ""}});
    if (rec->row && rec->row->failed_now) {
        failed_after_processing_.Increment();
        log_.error("alert: payment failed after processing; dead-lettered, replay charges again",
                   {{"alert", true}, {"billing_key", key}, {"event", ev->id}, {"reason", rec->row->note}});
    }
    if (rec->row && rec->row->anomaly) {
        anomalies_.Increment();
        log_.error("alert: Stripe reports what chargeguard never asked for",
                   {{"alert", true}, {"billing_key", key}, {"event", ev->id}, {"note", rec->row->note}});
    }
    co_return webhook_json(200, R"({"received":true})");
}

asio::awaitable<bool> webhook_receiver::refund_vault(const stripe::webhook_event& ev,
                                                     const billing::payment_fact& f) {
    if (f.kind != billing::fact_kind::refunded && f.kind != billing::fact_kind::refund_update) co_return true;
    if (f.charge_id.empty() && f.payment_intent_id.empty()) co_return true;
    auto r = co_await vault_.apply_refund_by_object(f.charge_id, f.payment_intent_id);
    if (!r) {
        log_.error("webhook refund not applied to the vault",
                   {{"event", ev.id}, {"charge", f.charge_id}, {"error", r.err().describe()}});
        co_return false;
    }
    for (const auto& a : *r) {
        vault_refunds_.Increment();
        log_.info("vault reservation refunded", {{"event", ev.id},
                                                 {"vault_key", a.key_id},
                                                 {"idempotency_key", a.idempotency_key},
                                                 {"refunded_cents", a.refunded_cents},
                                                 {"reopened_cents", a.reopened_cents}});
    }
    co_return true;
}

}  // namespace cg::app
