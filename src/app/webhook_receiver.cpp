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

constexpr const char* insert_event_sql =
    "INSERT INTO stripe_webhook_events (id, type, created, livemode, object_id, payload) "
    "VALUES ($1, $2, to_timestamp($3), $4, NULLIF($5, ''), $6::jsonb) "
    "ON CONFLICT (id) DO NOTHING RETURNING id";

}  // namespace

webhook_receiver::webhook_receiver(webhook_receiver_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                                   metrics::registry& reg)
    : cfg_(std::move(cfg)),
      pool_(std::move(pool)),
      log_(std::move(log)),
      deliveries_(
          reg.counter("chargeguard_webhook_deliveries_total",
                      "Stripe webhook deliveries by outcome (recorded, duplicate, bad_signature, stale, "
                      "malformed, too_large, error)")),
      lag_(reg.histogram("chargeguard_webhook_lag_seconds",
                         "Time from a Stripe event's creation to its first recorded delivery")
               .Add({}, webhook_lag_buckets())) {
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

// Inserts the event (autocommit: the row is durable when the reply arrives), then answers. Any failure
// between the two answers 500 so that Stripe delivers again; the insert is idempotent on the event id.
asio::awaitable<http::response> webhook_receiver::record(const http::request& req,
                                                         std::int64_t received_unix) {
    auto ev = stripe::parse_webhook_event(req.body);
    if (!ev) co_return refuse(400, "malformed", ev.err().message);
    auto conn = co_await pool_->acquire();
    if (!conn) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        log_.error("webhook not recorded: no PostgreSQL connection",
                   {{"event", ev->id}, {"error", conn.err().describe()}});
        co_return webhook_json(500, R"({"error":{"message":"not recorded, retry"}})");
    }
    auto rows = co_await (*conn)->query(insert_event_sql, ev->id, ev->type, ev->created, ev->livemode,
                                        ev->object_id, req.body);
    if (!rows) {
        deliveries_.Add({{"outcome", "error"}}).Increment();
        log_.error("webhook not recorded", {{"event", ev->id}, {"error", rows.err().describe()}});
        co_return webhook_json(500, R"({"error":{"message":"not recorded, retry"}})");
    }
    if (rows->empty()) {
        deliveries_.Add({{"outcome", "duplicate"}}).Increment();
        log_.info("webhook duplicate ignored", {{"event", ev->id}, {"type", ev->type}});
        co_return webhook_json(200, R"({"received":true,"duplicate":true})");
    }
    deliveries_.Add({{"outcome", "recorded"}}).Increment();
    lag_.Observe(static_cast<double>(std::max<std::int64_t>(0, received_unix - ev->created)));
    log_.info("webhook recorded", {{"event", ev->id}, {"type", ev->type}, {"object", ev->object_id}});
    co_return webhook_json(200, R"({"received":true})");
}

}  // namespace cg::app
