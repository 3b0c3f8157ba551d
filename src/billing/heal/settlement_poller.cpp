#include "billing/heal/settlement_poller.hpp"

#include <asio/this_coro.hpp>

#include "billing/machine/machine.hpp"
#include "metrics/registry.hpp"
#include "stripe/client.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::billing {
namespace {

std::int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// A retrieved PaymentIntent's or charge's fact, as of now.
payment_fact retrieved_fact(fact_kind kind, std::string source, std::string payment_intent_id,
                            std::string charge_id, std::string status, std::string failure) {
    payment_fact f;
    f.kind = kind;
    f.source = std::move(source);
    f.payment_intent_id = std::move(payment_intent_id);
    f.charge_id = std::move(charge_id);
    f.status = std::move(status);
    f.failure = std::move(failure);
    f.created = unix_now();
    return f;
}

// What Stripe says now of a row left processing, as a fact: its PaymentIntent, or (none recorded) its
// charge. nullopt, logged, when the retrieve failed. Completes on the client's completion executor.
net::awaitable<std::optional<payment_fact>> retrieve_fact(stripe::client& stripe, const logger& log,
                                                          const processing_row& row) {
    if (row.payment_intent_id) {
        auto pi = co_await stripe.retrieve_payment_intent(*row.payment_intent_id, row.stripe_account);
        if (!pi) {
            log.warn("cannot retrieve a payment intent left processing",
                     {{"billing_key", row.key},
                      {"payment_intent", *row.payment_intent_id},
                      {"error", pi.err().describe()}});
            co_return std::nullopt;
        }
        auto f = retrieved_fact(fact_kind_for_intent_status(pi->status), "retrieve payment_intent", pi->id,
                                pi->latest_charge, pi->status, pi->last_error_code);
        f.account = row.stripe_account;  // retrieved in the row's account
        co_return f;
    }
    auto ch = co_await stripe.retrieve_charge(row.charge_id.value_or(""), row.stripe_account);
    if (!ch) {
        log.warn("cannot retrieve a charge left processing", {{"billing_key", row.key},
                                                              {"charge_id", row.charge_id.value_or("")},
                                                              {"error", ch.err().describe()}});
        co_return std::nullopt;
    }
    auto f = retrieved_fact(fact_kind_for_charge_status(ch->status), "retrieve charge", ch->payment_intent,
                            ch->id, ch->status, ch->failure_code);
    f.account = row.stripe_account;  // retrieved in the row's account
    co_return f;
}

}  // namespace

struct settlement_poller::metrics_set {
    metrics::Counter* settled = nullptr;
    metrics::Counter* still = nullptr;
    metrics::Counter* errors = nullptr;
    metrics::Counter* failed_after_processing = nullptr;
    metrics::Gauge* processing_rows = nullptr;
    metrics::Gauge* oldest_processing = nullptr;

    explicit metrics_set(metrics::registry& reg) {
        processing_rows =
            &reg.gauge("chargeguard_billing_processing_records",
                       "Ledger rows processing (waiting for the bank's answer), read each poll pass")
                 .Add({});
        oldest_processing =
            &reg.gauge("chargeguard_billing_oldest_processing_age_seconds",
                       "Age of the oldest processing ledger row (0 when none), read each poll pass")
                 .Add({});
        auto& polls =
            reg.counter("chargeguard_billing_processing_polls_total",
                        "Rows left processing retrieved from Stripe by the poll, by result (settled, "
                        "processing, error)");
        settled = &polls.Add({{"result", "settled"}});
        still = &polls.Add({{"result", "processing"}});
        errors = &polls.Add({{"result", "error"}});
        failed_after_processing =
            &reg.counter("chargeguard_billing_failed_after_processing_total",
                         "Payments that failed after processing (dead-lettered; a replay charges again)")
                 .Add({});
    }
};

settlement_poller::settlement_poller(poller_config cfg, std::shared_ptr<pg::pool> pool,
                                     stripe::client& stripe, logger log, metrics::registry* reg)
    : cfg_(cfg),
      pool_(std::move(pool)),
      store_(pool_),
      stripe_(stripe),
      log_(std::move(log)),
      metrics_(reg ? std::make_unique<metrics_set>(*reg) : nullptr),
      pacer_(cfg.rate_per_second > 0 ? cfg.rate_per_second : 1, 1),
      reg_(reg) {}

settlement_poller::~settlement_poller() {
    task_.request_stop();
}

net::awaitable<void> settlement_poller::pace() {
    auto wait = pacer_.delay(request_pacer::clock::now());
    if (wait <= request_pacer::clock::duration::zero()) co_return;
    net::steady_timer t(co_await asio::this_coro::executor, wait);
    co_await t.async_wait();
}

net::awaitable<result<poll_report>> settlement_poller::poll_once() {
    poll_report rep;
    auto count_error = [&] {
        ++rep.errors;
        if (metrics_) metrics_->errors->Increment();
    };
    auto alert_failed = [&](const std::string& key, const std::string& reason) {
        ++rep.failed;
        if (metrics_) metrics_->failed_after_processing->Increment();
        log_.error("alert: payment failed after processing; dead-lettered, replay charges again",
                   {{"alert", true}, {"billing_key", key}, {"reason", reason}});
    };
    auto due = co_await store_.due_for_poll(cfg_.poll_after, cfg_.batch);
    if (!due) co_return due.err();
    rep.due = due->size();
    for (const auto& row : *due) {
        if (task_.stopping()) break;
        co_await pace();
        auto f = co_await retrieve_fact(stripe_, log_, row);
        if (!f) {
            count_error();
            continue;
        }
        ++rep.retrieved;
        auto applied = co_await store_.apply_retrieved(row.key, *f);
        if (!applied) {
            count_error();
            log_.warn("cannot apply a retrieved payment",
                      {{"billing_key", row.key}, {"error", applied.err().describe()}});
            continue;
        }
        if (!*applied) continue;
        const auto& s = **applied;
        bool left = !machine::awaits_payment_fact(s.after.status);
        if (metrics_) (left ? metrics_->settled : metrics_->still)->Increment();
        if (left) ++rep.settled;
        log_.info(
            "polled a payment left processing",
            {{"billing_key", row.key}, {"stripe_status", f->status}, {"status", to_string(s.after.status)}});
        if (s.failed_now) alert_failed(row.key, s.note);
        if (s.anomaly)
            log_.error("alert: Stripe reports what chargeguard never asked for",
                       {{"alert", true}, {"billing_key", row.key}, {"note", s.note}});
    }
    if (metrics_) {
        auto sum = co_await store_.processing_summary();
        if (sum) {
            metrics_->processing_rows->Set(static_cast<double>(sum->first));
            metrics_->oldest_processing->Set(sum->second);
        }
    }
    auto deferred = co_await store_.rows_with_deferred_events(cfg_.deferred_after, cfg_.batch);
    if (!deferred) {
        log_.warn("cannot read the deferred webhook events", {{"error", deferred.err().describe()}});
        co_return rep;
    }
    for (const auto& key : *deferred) {
        auto applied = co_await store_.apply_recorded(key);
        if (!applied) {
            ++rep.errors;
            continue;
        }
        ++rep.deferred_rows;
        if (*applied && (*applied)->failed_now) alert_failed(key, (*applied)->note);
    }
    co_return rep;
}

void settlement_poller::start(asio::any_io_executor ex, std::shared_ptr<settlement_poller> self) {
    net::job_spec job;
    job.name = "processing poll";
    job.interval = cfg_.interval;
    job.metrics = reg_;
    task_.start_job(
        std::move(ex), self, std::move(job), [this] { return pass(); }, log_);
}

net::awaitable<bool> settlement_poller::pass() {
    auto rep = co_await poll_once();
    if (!rep)
        log_.warn("processing poll failed; trying again next pass", {{"error", rep.err().describe()}});
    else if (rep->due > 0 || rep->deferred_rows > 0)
        log_.info("processing poll pass", {{"due", rep->due},
                                           {"retrieved", rep->retrieved},
                                           {"settled", rep->settled},
                                           {"failed_after_processing", rep->failed},
                                           {"errors", rep->errors},
                                           {"deferred_rows", rep->deferred_rows}});
    co_return true;
}

net::awaitable<void> settlement_poller::stop() {
    co_await task_.stop();
}

}  // namespace cg::billing
