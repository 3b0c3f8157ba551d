#include "billing/heal/backfill.hpp"

#include <asio/co_spawn.hpp>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger_batch.hpp"
#include "billing/store/settlement_store.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {

namespace {

// One page's missing rows at once; a row a delivery (or another sidecar's backfill) wrote first wins, by key
// or by (customer_id, billing_period). RETURNING names the rows inserted.
const std::string backfill_insert_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, "
    "status, charge_id, payment_intent_id, description, key_namespace, recovered_at, stripe_attempts, "
    "first_stripe_attempt_at, last_error, stripe_account) "
    "SELECT v.key, v.customer_id, v.billing_period, v.amount_cents, v.currency, v.stripe_customer_id, "
    "'charged', v.charge_id, nullif(v.payment_intent_id, ''), nullif(v.description, ''), $11::text, now(), "
    "1, "
    "to_timestamp(v.created), 'recovered by the backfill from Stripe charge ' || v.charge_id, "
    "nullif($12::text, '') "
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

// A charge of this namespace still in flight (a bank debit's `pending` charge) or failed after processing
// (a bank debit's `failed` one), kept until the window has been read: a key's succeeded charge anywhere in
// it wins, then its newest pending one, then its newest failed one.
struct in_flight_candidate {
    stripe::charge ch;
    std::string key, customer, period;
    bool failed = false;
    std::size_t order = 0;  // position in the listing, newest first
};

// The metadata of a charge this namespace made: its key is the one we would compute from its customer and
// period (the key hashes the namespace in).
struct charge_owner {
    std::string key, customer, period;
};
std::optional<charge_owner> owner_of(const stripe::charge& ch, const std::string& ns,
                                     const std::string& account) {
    if (ch.customer.empty()) return std::nullopt;
    auto key = stripe::metadata_value(ch.metadata, "billing_key");
    auto customer = stripe::metadata_value(ch.metadata, "customer_id");
    auto period = stripe::metadata_value(ch.metadata, "billing_period");
    if (!key || !customer || !period || customer->empty() || period->empty()) return std::nullopt;
    if (base_key(ns, *customer, *period, account) != *key) return std::nullopt;
    return charge_owner{std::string(*key), std::string(*customer), std::string(*period)};
}

void add_charged(const stripe::charge& ch, const charge_owner& o, missing_rows& out) {
    out.keys.emplace_back(o.key);
    out.customers.emplace_back(o.customer);
    out.periods.emplace_back(o.period);
    out.amounts.push_back(ch.amount);
    out.currencies.push_back(ch.currency);
    out.stripe_customers.push_back(ch.customer);
    out.charges.push_back(ch.id);
    out.intents.push_back(ch.payment_intent);
    out.descriptions.push_back(ch.description);
    out.created.push_back(ch.created);
}

// A row in flight is inserted `processing`, as the pipeline leaves one: with the delivery a later dead letter
// re-publishes (the event as its producer would publish it, to the consumer's topic and channel) and the key
// generation its charge was made under, so a replay after a failure charges under the next one. A failed
// charge's row is then failed by the same step as the poll's (settlement_store::apply_retrieved), which
// writes its dead letter.
const std::string backfill_in_flight_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, status, charge_id, payment_intent_id, description, payment_method, off_session, "
    "key_namespace, recovered_at, stripe_attempts, first_stripe_attempt_at, key_generation, "
    "processing_since, "
    "stripe_status, stripe_status_at, nsq_topic, nsq_channel, raw_body, last_error, stripe_account) "
    "SELECT v.key, v.customer_id, v.billing_period, v.amount_cents, v.currency, v.stripe_customer_id, "
    "'processing', v.charge_id, nullif(v.payment_intent_id, ''), nullif(v.description, ''), "
    "nullif(v.payment_method, ''), CASE WHEN v.payment_method <> '' THEN true END, $14::text, now(), 1, "
    "to_timestamp(v.created), v.generation::int, to_timestamp(v.created), v.stripe_status, now(), $15::text, "
    "$16::text, convert_to(v.raw_body, 'UTF8'), "
    "'recovered by the backfill from Stripe charge ' || v.charge_id || ' (' || v.stripe_status || ')', "
    "nullif($18::text, '') "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::text[], $7::text[], "
    "$8::text[], $9::text[], $10::text[], $11::int8[], $12::int8[], $13::text[], $17::text[]) AS v(key, "
    "customer_id, billing_period, amount_cents, currency, stripe_customer_id, charge_id, payment_intent_id, "
    "description, payment_method, created, generation, raw_body, stripe_status) "
    "ON CONFLICT DO NOTHING RETURNING key";

}  // namespace

struct backfill::state {
    backfill_config cfg;
    std::shared_ptr<pg::pool> pool;
    stripe::client* stripe = nullptr;
    logger log;
    metrics::Counter* inserted = nullptr;
    metrics::Counter* errors = nullptr;
    metrics::Counter* failed_after_processing = nullptr;
    std::unique_ptr<settlement_store> settlements;
    net::stoppable_task task;
};

namespace {

using backfill_state_ptr = std::shared_ptr<backfill::state>;

net::awaitable<result<std::size_t>> insert_missing(backfill_state_ptr st, missing_rows m,
                                                   std::string account) {
    pg::params p;
    p.reserve(12);
    p.add(text_array_literal(m.keys)).add(text_array_literal(m.customers)).add(text_array_literal(m.periods));
    p.add(int_array_literal(m.amounts)).add(text_array_literal(m.currencies));
    p.add(text_array_literal(m.stripe_customers)).add(text_array_literal(m.charges));
    p.add(text_array_literal(m.intents)).add(text_array_literal(m.descriptions));
    p.add(int_array_literal(m.created)).add(st->cfg.key_namespace).add(std::move(account));
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

// Keeps, per key, the in-flight candidate that stands for its row: the newest pending charge, else the
// newest failed one. The key generation of that charge is one more than the failed bank debits of the key
// listed before it in time (each failure after processing moved the key to its next generation).
std::vector<std::pair<in_flight_candidate, std::int64_t>> choose_in_flight(
    std::vector<in_flight_candidate> all, const std::set<std::string>& charged_keys) {
    std::map<std::string, std::vector<in_flight_candidate>> by_key;
    for (auto& c : all)
        if (!charged_keys.contains(c.key)) by_key[c.key].push_back(std::move(c));
    std::vector<std::pair<in_flight_candidate, std::int64_t>> out;
    for (auto& [key, cs] : by_key) {
        const in_flight_candidate* pick = nullptr;
        for (const auto& c : cs)  // newest first: the first pending, else the first failed
            if (!c.failed && (!pick || pick->failed)) pick = &c;
        if (!pick) pick = &cs.front();
        std::int64_t generation = 1;
        for (const auto& c : cs)
            if (c.failed && c.order > pick->order) ++generation;
        out.emplace_back(*pick, generation);
    }
    return out;
}

net::awaitable<result<std::size_t>> insert_in_flight(
    backfill_state_ptr st, const std::vector<std::pair<in_flight_candidate, std::int64_t>>& rows,
    backfill_report& rep, std::string account) {
    std::vector<std::string> keys, customers, periods, currencies, stripe_customers, charges, intents,
        descriptions, methods, bodies, statuses;
    std::vector<std::int64_t> amounts, created, generations;
    std::map<std::string, const in_flight_candidate*> by_key;
    for (const auto& [c, generation] : rows) {
        billing_event ev;
        ev.customer_id = c.customer;
        ev.billing_period = c.period;
        ev.amount_cents = c.ch.amount;
        ev.currency = c.ch.currency;
        ev.stripe_customer_id = c.ch.customer;
        ev.description = c.ch.description;
        ev.stripe_account = account;
        // A PaymentIntent's charge names the payment method the event carried; a /v1/charges charge was
        // made without one (the customer's default source). Stripe does not report off_session: a billing
        // run's payment is off-session (the event's default).
        if (!c.ch.payment_intent.empty()) ev.payment_method = c.ch.payment_method;
        keys.push_back(c.key);
        customers.push_back(c.customer);
        periods.push_back(c.period);
        amounts.push_back(c.ch.amount);
        currencies.push_back(c.ch.currency);
        stripe_customers.push_back(c.ch.customer);
        charges.push_back(c.ch.id);
        intents.push_back(c.ch.payment_intent);
        descriptions.push_back(c.ch.description);
        methods.push_back(ev.payment_method);
        created.push_back(c.ch.created);
        generations.push_back(generation);
        bodies.push_back(to_json(ev));
        statuses.push_back(c.ch.status);
        by_key[c.key] = &c;
    }
    pg::params p;
    p.reserve(18);
    p.add(text_array_literal(keys)).add(text_array_literal(customers)).add(text_array_literal(periods));
    p.add(int_array_literal(amounts)).add(text_array_literal(currencies));
    p.add(text_array_literal(stripe_customers)).add(text_array_literal(charges));
    p.add(text_array_literal(intents)).add(text_array_literal(descriptions)).add(text_array_literal(methods));
    p.add(int_array_literal(created)).add(int_array_literal(generations)).add(text_array_literal(bodies));
    p.add(st->cfg.key_namespace).add(st->cfg.topic).add(st->cfg.channel).add(text_array_literal(statuses));
    p.add(account);
    auto r = co_await pg::exec_pooled(st->pool, backfill_in_flight_sql, std::move(p),
                                      pg::acquire_mode::wait_for_server);
    if (!r) co_return r.err();
    std::vector<std::string> inserted;
    for (std::size_t i = 0; i < r->size(); ++i) inserted.push_back(r->get<std::string>(i, 0));
    if (st->inserted) st->inserted->Increment(static_cast<double>(inserted.size()));
    for (const auto& key : inserted) {
        const auto& c = *by_key.at(key);
        st->log.warn(
            "ledger row recovered from Stripe: it was missing although its bank debit was made (a lost "
            "commit, e.g. a PostgreSQL failover); recovered processing",
            {{"alert", true}, {"billing_key", key}, {"charge_id", c.ch.id}, {"stripe_status", c.ch.status}});
        std::optional<row_settlement> settled;
        if (c.failed) {
            payment_fact f;
            f.kind = fact_kind::failed;
            f.source = "backfill: charge";
            f.charge_id = c.ch.id;
            f.payment_intent_id = c.ch.payment_intent;
            f.status = c.ch.status;
            f.failure = c.ch.failure_code;
            f.account = account;  // listed in the row's account
            f.created = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
            auto a = co_await st->settlements->apply_retrieved(key, std::move(f));
            if (!a) co_return a.err();
            settled = std::move(*a);
        }
        // Webhook events that arrived while the row was missing (recorded as naming no row) apply now.
        auto recorded = co_await st->settlements->apply_recorded(key);
        if (!recorded) co_return recorded.err();
        bool failed_now = (settled && settled->failed_now) || (*recorded && (*recorded)->failed_now);
        const auto now = *recorded ? (*recorded)->after.status
                         : settled ? settled->after.status
                                   : record_status::processing;
        if (now == record_status::processing) ++rep.processing;
        if (failed_now) {
            ++rep.failed;
            if (st->failed_after_processing) st->failed_after_processing->Increment();
            st->log.error("alert: payment failed after processing; dead-lettered, replay charges again",
                          {{"alert", true},
                           {"billing_key", key},
                           {"reason", settled ? settled->note : (*recorded)->note}});
        }
    }
    co_return inserted.size();
}

// One account's window: the platform's (`account` empty) or a connected account's, listed in that account.
net::awaitable<result<void>> backfill_account(backfill_state_ptr st, std::string account,
                                              backfill_report& rep) {
    stripe::list_charges_request req;
    req.stripe_account = account;
    req.limit = st->cfg.page_size;
    req.created_gte = std::chrono::duration_cast<std::chrono::seconds>(
                          (std::chrono::system_clock::now() - st->cfg.window).time_since_epoch())
                          .count();
    // Without the consumer's topic and channel a row in flight could not get its dead letter: only
    // succeeded charges are backfilled then.
    const bool follow_in_flight = !st->cfg.topic.empty() && !st->cfg.channel.empty();
    std::vector<in_flight_candidate> in_flight;
    std::set<std::string> charged_keys;
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
            auto o = owner_of(ch, st->cfg.key_namespace, account);
            if (!o) continue;
            auto fact = stripe::read(ch, account);
            if (fact.moved == stripe::movement::charged) {
                ++rep.ours;
                charged_keys.insert(o->key);
                add_charged(ch, *o, m);
            } else if (follow_in_flight && fact.bank_debit &&
                       (fact.moved == stripe::movement::in_flight ||
                        fact.moved == stripe::movement::failed)) {
                ++rep.ours;
                bool failed = fact.moved == stripe::movement::failed;
                in_flight.push_back({ch, o->key, o->customer, o->period, failed, rep.listed});
            }
        }
        if (!m.empty()) {
            auto n = co_await insert_missing(st, std::move(m), account);
            if (!n) co_return n.err();
            rep.inserted += *n;
        }
        if (!got->has_more || got->data.empty() || st->task.stopping()) break;
        req.starting_after = got->data.back().id;
    }
    if (!in_flight.empty()) {
        auto n =
            co_await insert_in_flight(st, choose_in_flight(std::move(in_flight), charged_keys), rep, account);
        if (!n) co_return n.err();
        rep.inserted += *n;
    }
    co_return result<void>{};
}

// The connected accounts the ledger has rows for, one index probe each (a loose scan of the partial index
// billing_records_stripe_account_idx, migration 0017): the accounts whose lost rows the backfill looks for.
const std::string ledger_accounts_sql =
    "WITH RECURSIVE a(account) AS (SELECT min(stripe_account) FROM billing_records "
    "WHERE stripe_account IS NOT NULL UNION ALL SELECT (SELECT min(b.stripe_account) FROM billing_records b "
    "WHERE b.stripe_account > a.account) FROM a WHERE a.account IS NOT NULL) "
    "SELECT account FROM a WHERE account IS NOT NULL";

net::awaitable<result<backfill_report>> backfill_run(backfill_state_ptr st) {
    backfill_report rep;
    // The platform first, then every connected account the ledger knows, then those configured that it
    // does not (Stripe Connect: each account has its own charges, listed with its Stripe-Account). An
    // account none of whose rows survived is known only from the configuration.
    std::vector<std::string> accounts{""};
    auto known = co_await pg::exec_pooled(st->pool, ledger_accounts_sql, pg::params(),
                                          pg::acquire_mode::wait_for_server);
    if (!known) co_return known.err();
    std::set<std::string> listed;
    for (std::size_t i = 0; i < known->size(); ++i)
        if (listed.insert(known->get<std::string>(i, 0)).second)
            accounts.push_back(known->get<std::string>(i, 0));
    for (const auto& account : st->cfg.connect_accounts)
        if (!account.empty() && listed.insert(account).second) accounts.push_back(account);
    for (auto& account : accounts) {
        if (st->task.stopping()) break;
        auto done = co_await backfill_account(st, std::move(account), rep);
        if (!done) co_return done.err();
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
    st_->settlements = std::make_unique<settlement_store>(st_->pool);
    if (!reg) return;
    st_->inserted =
        &reg->counter("chargeguard_billing_backfilled_total",
                      "Ledger rows the backfill recovered from Stripe charges (rows lost entirely)")
             .Add({});
    st_->errors = &reg->counter("chargeguard_billing_backfill_errors_total",
                                "Backfill runs that failed (Stripe list or ledger insert)")
                       .Add({});
    st_->failed_after_processing =
        &reg->counter("chargeguard_billing_failed_after_processing_total",
                      "Payments that failed after processing (dead-lettered; a replay charges again)")
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
