#include "billing/backfill.hpp"

#include <asio/co_spawn.hpp>
#include <vector>

#include "billing/key.hpp"
#include "billing/ledger_batch.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "stripe/client.hpp"

namespace cg::billing {

namespace {

// One page's missing rows at once; a row a delivery (or another sidecar's backfill) wrote first wins, by key
// or by (customer_id, billing_period). RETURNING names the rows inserted.
const std::string backfill_insert_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, "
    "status, charge_id, payment_intent_id, description, key_namespace, recovered_at, stripe_attempts, "
    "first_stripe_attempt_at, last_error) "
    "SELECT v.key, v.customer_id, v.billing_period, v.amount_cents, v.currency, v.stripe_customer_id, "
    "'charged', v.charge_id, nullif(v.payment_intent_id, ''), nullif(v.description, ''), $11::text, now(), "
    "1, "
    "to_timestamp(v.created), 'recovered by the backfill from Stripe charge ' || v.charge_id "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::text[], $7::text[], "
    "$8::text[], $9::text[], $10::int8[]) AS v(key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, charge_id, payment_intent_id, description, created) "
    "ON CONFLICT DO NOTHING RETURNING key, charge_id";

struct missing_rows {
    std::vector<std::string> keys, customers, periods, currencies, stripe_customers, charges, intents,
        descriptions;
    std::vector<std::int64_t> amounts, created;
    bool empty() const noexcept { return keys.empty(); }
};

// The charge is this namespace's when its metadata's key is the one we would compute from its customer and
// period (the key hashes the namespace in).
bool ours(const stripe::charge& ch, const std::string& ns, missing_rows& out) {
    if (ch.status != "succeeded" || ch.customer.empty()) return false;
    auto key = stripe::metadata_value(ch.metadata, "billing_key");
    auto customer = stripe::metadata_value(ch.metadata, "customer_id");
    auto period = stripe::metadata_value(ch.metadata, "billing_period");
    if (!key || !customer || !period || customer->empty() || period->empty()) return false;
    if (base_key(ns, *customer, *period) != *key) return false;
    out.keys.emplace_back(*key);
    out.customers.emplace_back(*customer);
    out.periods.emplace_back(*period);
    out.amounts.push_back(ch.amount);
    out.currencies.push_back(ch.currency);
    out.stripe_customers.push_back(ch.customer);
    out.charges.push_back(ch.id);
    out.intents.push_back(ch.payment_intent);
    out.descriptions.push_back(ch.description);
    out.created.push_back(ch.created);
    return true;
}

}  // namespace

struct backfill::state {
    backfill_config cfg;
    std::shared_ptr<pg::pool> pool;
    stripe::client* stripe = nullptr;
    logger log;
    metrics::Counter* inserted = nullptr;
    metrics::Counter* errors = nullptr;
    net::stoppable_task task;
};

namespace {

using backfill_state_ptr = std::shared_ptr<backfill::state>;

net::awaitable<result<std::size_t>> insert_missing(backfill_state_ptr st, missing_rows m) {
    pg::params p;
    p.reserve(11);
    p.add(text_array_literal(m.keys)).add(text_array_literal(m.customers)).add(text_array_literal(m.periods));
    p.add(int_array_literal(m.amounts)).add(text_array_literal(m.currencies));
    p.add(text_array_literal(m.stripe_customers)).add(text_array_literal(m.charges));
    p.add(text_array_literal(m.intents)).add(text_array_literal(m.descriptions));
    p.add(int_array_literal(m.created)).add(st->cfg.key_namespace);
    auto r = co_await pg::exec_pooled(st->pool, backfill_insert_sql, std::move(p),
                                      pg::acquire_mode::wait_for_server);
    if (!r) co_return r.err();
    for (std::size_t i = 0; i < r->size(); ++i)
        st->log.warn(
            "ledger row recovered from Stripe: it was missing although its charge succeeded (a lost "
            "commit, e.g. a PostgreSQL failover)",
            {{"alert", true},
             {"billing_key", r->get<std::string>(i, 0)},
             {"charge_id", r->get<std::string>(i, 1)}});
    if (st->inserted) st->inserted->Increment(static_cast<double>(r->size()));
    co_return r->size();
}

net::awaitable<result<backfill_report>> backfill_run(backfill_state_ptr st) {
    backfill_report rep;
    stripe::list_charges_request req;
    req.limit = st->cfg.page_size;
    req.created_gte = std::chrono::duration_cast<std::chrono::seconds>(
                          (std::chrono::system_clock::now() - st->cfg.window).time_since_epoch())
                          .count();
    for (std::size_t page = 0;; ++page) {
        if (page == st->cfg.max_pages) {
            rep.truncated = true;
            st->log.warn("backfill stopped at its page limit before the end of the window",
                         {{"pages", static_cast<std::int64_t>(page)}});
            break;
        }
        auto got = co_await st->stripe->list_charges(req);
        if (!got) co_return got.err();
        missing_rows m;
        for (const auto& ch : got->data) {
            ++rep.listed;
            if (ours(ch, st->cfg.key_namespace, m)) ++rep.ours;
        }
        if (!m.empty()) {
            auto n = co_await insert_missing(st, std::move(m));
            if (!n) co_return n.err();
            rep.inserted += *n;
        }
        if (!got->has_more || got->data.empty() || st->task.stopping()) break;
        req.starting_after = got->data.back().id;
    }
    co_return rep;
}

net::awaitable<void> backfill_loop(backfill_state_ptr st) {
    auto wait = st->cfg.first_delay;
    while (!st->task.stopping()) {
        co_await st->task.sleep(wait);
        if (st->task.stopping()) break;
        wait = st->cfg.interval;
        auto rep = co_await backfill_run(st);
        if (!rep) {
            if (st->errors) st->errors->Increment();
            st->log.warn("backfill failed; trying again at the next interval",
                         {{"error", rep.err().describe()}});
        } else if (rep->inserted > 0) {
            st->log.info("backfill done", {{"listed", static_cast<std::int64_t>(rep->listed)},
                                           {"inserted", static_cast<std::int64_t>(rep->inserted)}});
        }
    }
}

}  // namespace

backfill::backfill(backfill_config cfg, std::shared_ptr<pg::pool> pool, stripe::client& stripe, logger log,
                   metrics::registry* reg)
    : st_(std::make_shared<state>()) {
    if (!valid_key_namespace(cfg.key_namespace)) throw std::invalid_argument("invalid key namespace");
    st_->cfg = std::move(cfg);
    st_->pool = std::move(pool);
    st_->stripe = &stripe;
    st_->log = log.with({{"component", "backfill"}});
    if (!reg) return;
    st_->inserted =
        &reg->counter("chargeguard_billing_backfilled_total",
                      "Ledger rows the backfill recovered from Stripe charges (rows lost entirely)")
             .Add({});
    st_->errors = &reg->counter("chargeguard_billing_backfill_errors_total",
                                "Backfill runs that failed (Stripe list or ledger insert)")
                       .Add({});
}

backfill::~backfill() {
    st_->task.request_stop();
}

net::awaitable<result<backfill_report>> backfill::run_once() {
    co_return co_await backfill_run(st_);
}

void backfill::start(asio::any_io_executor ex) {
    st_->task.start(ex, st_, backfill_loop(st_), st_->log, "backfill");
}

net::awaitable<void> backfill::stop() {
    auto st = st_;
    co_await st->task.stop();
}

}  // namespace cg::billing
