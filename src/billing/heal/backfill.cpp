#include "billing/heal/backfill.hpp"

#include <asio/co_spawn.hpp>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "billing/heal/backfill_rows.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "billing/store/ledger_batch.hpp"
#include "billing/store/settlement_store.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {

using namespace backfill_rows;

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
    metrics::registry* reg = nullptr;
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
        if (machine::awaits_payment_fact(now)) ++rep.processing;
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
            const auto fact = stripe::read(ch, account);
            const auto command = machine::on_backfill(fact, follow_in_flight);
            if (command == machine::backfill_command::insert_charged) {
                ++rep.ours;
                charged_keys.insert(o->key);
                add_charged(ch, *o, m);
            } else if (command != machine::backfill_command::none) {
                ++rep.ours;
                bool failed = command == machine::backfill_command::insert_processing_then_fail;
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

net::awaitable<bool> backfill_pass(backfill_state_ptr st) {
    auto rep = co_await backfill_run(st);
    if (!rep) {
        if (st->errors) st->errors->Increment();
        st->log.warn("backfill failed; trying again at the next interval", {{"error", rep.err().describe()}});
    } else if (rep->inserted > 0) {
        st->log.info("backfill done", {{"listed", static_cast<std::int64_t>(rep->listed)},
                                       {"inserted", static_cast<std::int64_t>(rep->inserted)}});
    }
    co_return true;
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
    st_->reg = reg;
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
    net::job_spec job;
    job.name = "backfill";
    job.interval = st_->cfg.interval;
    job.first_after = st_->cfg.first_delay;
    job.metrics = st_->reg;
    st_->task.start_job(
        ex, st_, std::move(job), [st = st_] { return backfill_pass(st); }, st_->log);
}

net::awaitable<void> backfill::stop() {
    auto st = st_;
    co_await st->task.stop();
}

}  // namespace cg::billing
