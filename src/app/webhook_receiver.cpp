#include "app/webhook_receiver.hpp"

#include <algorithm>
#include <array>

#include "billing/machine/machine.hpp"
#include "core/bytes.hpp"
#include "pg/rows.hpp"
#include "stripe/payment_method_change.hpp"
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

// Once per event id; a redelivery adds to `deliveries`. Returns how many deliveries it has had.
const std::string refusal_sql =
    "INSERT INTO stripe_webhook_refusals (event_id, type, reason, api_version, body) "
    "VALUES ($1, $2, $3, NULLIF($4, ''), decode($5, 'hex')) ON CONFLICT (event_id) DO UPDATE SET "
    "deliveries = stripe_webhook_refusals.deliveries + 1, last_at = now() RETURNING deliveries";

// Text for a text column: a NUL ends a C string (libpq) and no text column holds one.
std::string storable_text(std::string_view s) {
    std::string out(s);
    std::erase(out, '\0');
    return out;
}

// Holds one admission for the life of a delivery's handling.
struct in_flight_slot {
    std::size_t& n;
    explicit in_flight_slot(std::size_t& c) : n(c) { ++n; }
    ~in_flight_slot() { --n; }
    in_flight_slot(const in_flight_slot&) = delete;
    in_flight_slot& operator=(const in_flight_slot&) = delete;
};

}  // namespace

webhook_receiver::webhook_receiver(webhook_receiver_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                                   metrics::registry& reg)
    : cfg_(std::move(cfg)),
      pool_(std::move(pool)),
      log_(std::move(log)),
      settlements_(pool_),
      vault_(pool_),
      retries_(pool_),
      deliveries_(reg.counter(
          "chargeguard_webhook_deliveries_total",
          "Stripe webhook deliveries by outcome (recorded, duplicate, other_payment, bad_signature, "
          "stale, malformed, poison, wrong_api_version, too_large, busy, error)")),
      lag_(reg.histogram("chargeguard_webhook_lag_seconds",
                         "Time from a Stripe event's creation to its first recorded delivery")
               .Add({}, webhook_lag_buckets())),
      events_(
          reg.counter("chargeguard_webhook_events_total",
                      "Recorded Stripe events by what they did to the ledger (applied, no_change, deferred, "
                      "other_payment, unconfirmed, unknown_type, unknown_object, unreadable)")),
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
    for (const char* r : {"applied", "no_change", "deferred", "other_payment", "unconfirmed", "unknown_type",
                          "unknown_object", "unreadable"})
        events_.Add({{"result", r}});
    // Every outcome exists from the start, so a rate() over a refused outcome works before the first one.
    for (const char* o : {"recorded", "duplicate", "other_payment", "bad_signature", "stale", "malformed",
                          "poison", "wrong_api_version", "too_large", "busy", "error"})
        deliveries_.Add({{"outcome", o}});
}

void webhook_receiver::retry_declined_with(nsq::producer& producer, stripe::client& stripe,
                                           std::string topic) {
    retry_producer_ = &producer;
    retry_stripe_ = &stripe;
    retry_topic_ = std::move(topic);
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

http::response webhook_receiver::busy(std::string_view why) {
    deliveries_.Add({{"outcome", "busy"}}).Increment();
    log_.warn("webhook delivery deferred: busy", {{"status", 503}, {"reason", why}});
    auto r = webhook_json(503, R"({"error":{"message":"busy, retry"}})");
    r.headers.set("Retry-After", std::to_string(cfg_.retry_after.count()));
    return r;
}

// PostgreSQL is up (the pool's cached view) yet no connection came: every one was in use.
bool webhook_receiver::pool_busy_not_down() const {
    auto st = pool_->state();
    return st.up && st.in_use >= st.size;
}

asio::awaitable<http::response> webhook_receiver::refuse_event(const stripe::webhook_event& ev,
                                                               const std::string& body,
                                                               std::string_view outcome, std::string reason,
                                                               bool once) {
    // Named values only in the co_await expression (g++ 12 mishandles temporaries made there).
    auto p = pg::params(storable_text(ev.id), storable_text(ev.type), storable_text(reason),
                        storable_text(ev.api_version), to_hex(body));
    auto r = co_await pg::exec_pooled(pool_, refusal_sql, std::move(p), pg::acquire_mode::wait_for_server);
    if (!r) {
        if (pool_busy_not_down()) co_return busy(r.err().describe());
        deliveries_.Add({{"outcome", "error"}}).Increment();
        log_.error("webhook refusal not recorded", {{"event", ev.id}, {"error", r.err().describe()}});
        co_return webhook_json(500, R"({"error":{"message":"not recorded, retry"}})");
    }
    const auto deliveries = r->get<std::int64_t>(0, 0);
    if (once && deliveries > 1) {
        deliveries_.Add({{"outcome", "duplicate"}}).Increment();
        log_.info("webhook redelivery of a refused event acknowledged",
                  {{"event", ev.id}, {"deliveries", deliveries}, {"reason", reason}});
        co_return webhook_json(200, R"({"received":true,"refused":true})");
    }
    deliveries_.Add({{"outcome", std::string(outcome)}}).Increment();
    log_.error("webhook event refused", {{"status", 400},
                                         {"outcome", outcome},
                                         {"event", ev.id},
                                         {"type", ev.type},
                                         {"deliveries", deliveries},
                                         {"reason", reason}});
    co_return webhook_json(400, R"({"error":{"message":"refused: )" + std::string(outcome) + R"("}})");
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
    if (in_flight_ >= cfg_.max_in_flight)
        co_return busy(std::to_string(in_flight_) + " deliveries already being recorded");
    in_flight_slot slot(in_flight_);
    co_return co_await record(req, now);
}

// Records and applies the event in one transaction (billing/store/settlement_store.hpp), then answers. Any
// failure before the commit answers 500 so that Stripe delivers again; nothing of the event is then kept, and
// the redelivery records and applies it as if it were the first.
asio::awaitable<http::response> webhook_receiver::record(const http::request& req,
                                                         std::int64_t received_unix) {
    auto ev = stripe::parse_webhook_event(req.body);
    if (!ev) co_return refuse(400, "malformed", ev.err().message);
    // Named values only in the co_await expressions (g++ 12 mishandles temporaries made there).
    if (!ev->unstorable.empty()) {
        std::string why = "unstorable: " + ev->unstorable;
        co_return co_await refuse_event(*ev, req.body, "poison", std::move(why), true);
    }
    // Objects rendered in another version have other shapes (fields missing or renamed): never read as
    // this version's. Refused every time: the endpoint's version is the fix, and the poll settles rows.
    if (ev->api_version != cfg_.api_version) {
        std::string named = ev->api_version.empty() ? std::string("(none)") : ev->api_version;
        std::string why = "api_version " + named + ", the receiver reads " + cfg_.api_version +
                          ": create the endpoint with api_version " + cfg_.api_version;
        co_return co_await refuse_event(*ev, req.body, "wrong_api_version", std::move(why), false);
    }
    auto rec = co_await settlements_.record_event(*ev, req.body);
    if (!rec) {
        if (rec.err().code == pg::errc::unavailable && pool_busy_not_down())
            co_return busy(rec.err().describe());
        deliveries_.Add({{"outcome", "error"}}).Increment();
        log_.error("webhook not recorded", {{"event", ev->id}, {"error", rec.err().describe()}});
        co_return webhook_json(500, R"({"error":{"message":"not recorded, retry"}})");
    }
    bool refunded = co_await refund_vault(*ev, rec->fact);
    if (!refunded) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        co_return webhook_json(500, R"({"error":{"message":"refund not applied to the vault, retry"}})");
    }
    bool retried = co_await retry_declined(*ev, req.body);
    if (!retried) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        co_return webhook_json(500, R"({"error":{"message":"declined rows not all retried, retry"}})");
    }
    if (rec->duplicate) {
        deliveries_.Add({{"outcome", "duplicate"}}).Increment();
        log_.info("webhook duplicate ignored", {{"event", ev->id}, {"type", ev->type}});
        co_return webhook_json(200, R"({"received":true,"duplicate":true})");
    }
    const bool other = rec->outcome == billing::to_string(billing::settle_result::other_payment);
    deliveries_.Add({{"outcome", other ? "other_payment" : "recorded"}}).Increment();
    events_.Add({{"result", rec->outcome}}).Increment();
    if (other && rec->row) {
        const auto& row = rec->row->before;
        log_.warn("webhook names another payment than the row it found: recorded, nothing changed",
                  {{"event", ev->id},
                   {"type", ev->type},
                   {"billing_key", rec->row->key},
                   {"event_payment_intent", rec->fact.payment_intent_id},
                   {"event_charge", rec->fact.charge_id},
                   {"event_account", rec->fact.account},
                   {"row_payment_intent", row.payment_intent_id.value_or("")},
                   {"row_charge", row.charge_id.value_or("")},
                   {"row_account", row.stripe_account},
                   {"note", rec->row->note}});
    }
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
    if (!billing::machine::names_refund(f.kind)) co_return true;
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

asio::awaitable<bool> webhook_receiver::retry_declined(const stripe::webhook_event& ev,
                                                       const std::string& body) {
    if (!retry_producer_ || !stripe::names_payment_method_change(ev.type)) co_return true;
    auto change = stripe::read_payment_method_change(body);
    if (change.customer.empty()) {
        log_.debug("webhook event changes no payment method", {{"event", ev.id}, {"reason", change.why_not}});
        co_return true;
    }
    const std::string by = "webhook:" + ev.id;
    auto rows = co_await retries_.declined_of_stripe_customer(change.customer, change.account, by);
    if (!rows) {
        log_.error(
            "declined rows of a customer not read",
            {{"event", ev.id}, {"stripe_customer", change.customer}, {"error", rows.err().describe()}});
        co_return false;
    }
    if (rows->empty()) co_return true;
    declined_retry x{retries_,
                     *retry_producer_,
                     retry_topic_,
                     retry_stripe_,
                     {},
                     by,
                     ev.type,
                     true,
                     [&](std::string_view line, bool problem) {
                         std::array<log_field, 4> fields{
                             log_field("event", ev.id), log_field("stripe_customer", change.customer),
                             log_field("payment_method", change.payment_method), log_field("result", line)};
                         log_.log(problem ? log_level::warn : log_level::info,
                                  "declined row retried on a payment method change", fields);
                     },
                     {}};
    for (const auto& c : *rows)
        if (!co_await retry_declined_row(x, c)) break;
    co_return x.n.failed == 0;
}

}  // namespace cg::app
