#include "billing/heal/pending_age.hpp"

#include <asio/co_spawn.hpp>
#include <map>
#include <string>

#include "billing/store/abandoned_sql.hpp"
#include "billing/store/dead_letter_store.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "net/timeout.hpp"

namespace cg::billing {

namespace {
// Milliseconds, so the value decodes as int8; min(since) is NULL without pending rows. Charges' rows and
// correction revisions both: the sweeper takes up both. $1: the sweep bound in ms, NULL before
// watch_abandoned(); an abandoned row or revision is what the sweeper selects (sweeper.cpp): no live lease
// and no sign of life — a row's update or lease, a revision's start, lease or move's Stripe attempt — for
// longer than the bound.
const std::string& age_sql() {
    using namespace abandoned_sql;
    static const std::string sql =
        "SELECT count(*), coalesce((extract(epoch FROM now() - min(since)) * 1000)::bigint, 0), "
        "count(*) FILTER (WHERE abandoned), "
        "coalesce((extract(epoch FROM now() - min(active) FILTER (WHERE abandoned)) * 1000)::bigint, 0) "
        "FROM (SELECT since, active, $1::bigint IS NOT NULL AND unleased "
        "AND active < now() - $1::bigint * interval '1 millisecond' AS abandoned FROM ("
        "SELECT created_at AS since, " +
        record_active + " AS active, " + record_unleased +
        " AS unleased FROM billing_records WHERE status = 'pending' "
        "UNION ALL "
        "SELECT coalesce(c.started_at, c.created_at), " +
        revision_active + ", " + revision_unleased + " FROM billing_corrections c " + revision_moves_join +
        " WHERE c.status = 'pending') AS u) AS p";
    return sql;
}

// The outage numbers beside the ages: open dead letters by reason class (dead_letter_store.hpp) and letters
// dismissed so far (the rows processing are the settlement poller's gauge). The open letters sit in the
// partial index dead_letters_unresolved_idx (migration 0022).
const std::string& backlog_sql() {
    static const std::string sql =
        std::string("SELECT 'open:' || ") + letter_reason_class_sql +
        ", count(*) FROM dead_letters WHERE replayed_at IS NULL AND dismissed_at IS NULL GROUP BY 1 "
        "UNION ALL SELECT 'dismissed', count(*) FROM dead_letters WHERE dismissed_at IS NOT NULL";
    return sql;
}

// The reason classes letter_reason_class_sql yields: each is exported, 0 when no letter of it is open.
constexpr const char* letter_classes[] = {
    "conflict",           "stripe_rejected",         "stripe_idempotency_error",
    "spend_cap_exceeded", "failed_after_processing", "invalid"};
}  // namespace

struct pending_age_monitor::state {
    std::shared_ptr<pg::pool> pool;
    logger log;
    std::chrono::milliseconds interval;
    metrics::Gauge* age = nullptr;
    metrics::Gauge* count = nullptr;
    metrics::Counter* errors = nullptr;
    metrics::Gauge* abandoned_age = nullptr;
    metrics::Gauge* abandoned_count = nullptr;
    std::map<std::string, metrics::Gauge*> open_letters;  // by reason class
    metrics::Gauge* dismissed_letters = nullptr;
    std::optional<std::int64_t> abandoned_after_ms;  // the sweep bound, once watched
    metrics::registry* reg = nullptr;
    net::stoppable_task task;
};

namespace {

using state_ptr = std::shared_ptr<pending_age_monitor::state>;

net::awaitable<void> query_once(state_ptr st) {
    auto c = co_await st->pool->acquire();
    if (!c) {
        st->errors->Increment();
        st->log.warn("pending age query: no connection", {{"error", c.err().describe()}});
        co_return;
    }
    auto r = co_await (*c)->query(age_sql(), st->abandoned_after_ms);
    if (!r) {
        st->errors->Increment();
        st->log.warn("pending age query failed", {{"error", r.err().describe()}});
        co_return;
    }
    auto [n, ms, abandoned, abandoned_ms] =
        (*r)[0].as<std::int64_t, std::int64_t, std::int64_t, std::int64_t>();
    st->count->Set(static_cast<double>(n));
    st->age->Set(static_cast<double>(ms) / 1000.0);
    st->abandoned_count->Set(static_cast<double>(abandoned));
    st->abandoned_age->Set(static_cast<double>(abandoned_ms) / 1000.0);
    auto b = co_await (*c)->query(backlog_sql());
    if (!b) {
        st->errors->Increment();
        st->log.warn("dead letter and backlog query failed", {{"error", b.err().describe()}});
        co_return;
    }
    std::map<std::string, double> open;
    for (std::size_t i = 0; i < b->size(); ++i) {
        std::string what(b->text(i, 0));
        auto n_rows = static_cast<double>(b->get<std::int64_t>(i, 1));
        if (what == "dismissed")
            st->dismissed_letters->Set(n_rows);
        else if (what.rfind("open:", 0) == 0)
            open[what.substr(5)] = n_rows;
    }
    for (auto& [cls, gauge] : st->open_letters) gauge->Set(open.count(cls) ? open[cls] : 0.0);
}

net::awaitable<bool> query_pass(state_ptr st) {
    co_await query_once(st);
    co_return true;
}

}  // namespace

pending_age_monitor::pending_age_monitor(std::shared_ptr<pg::pool> pool, metrics::registry& reg, logger log,
                                         std::chrono::milliseconds interval)
    : st_(std::make_shared<state>()) {
    st_->pool = std::move(pool);
    st_->log = std::move(log);
    st_->interval = interval;
    st_->reg = &reg;
    st_->age =
        &reg.gauge("chargeguard_billing_oldest_pending_age_seconds",
                   "Age of the oldest pending billing record or correction revision (0 when none is pending)")
             .Add({});
    st_->count = &reg.gauge("chargeguard_billing_pending_records",
                            "Billing records and correction revisions in state pending")
                      .Add({});
    st_->abandoned_count =
        &reg.gauge("chargeguard_billing_abandoned_records",
                   "Pending billing records and correction revisions with no live lease and "
                   "no activity for longer than the sweep bound (what the sweeper takes up)")
             .Add({});
    st_->abandoned_age = &reg.gauge("chargeguard_billing_oldest_abandoned_age_seconds",
                                    "Time since the last activity of the least recently active abandoned "
                                    "billing record or correction revision (0 when none)")
                              .Add({});
    auto& open = reg.gauge("chargeguard_dead_letters_open",
                           "Dead letters neither replayed nor dismissed, by reason class (conflict, "
                           "stripe_rejected, stripe_idempotency_error, spend_cap_exceeded, "
                           "failed_after_processing, invalid)");
    for (const char* cls : letter_classes) st_->open_letters[cls] = &open.Add({{"reason", cls}});
    st_->dismissed_letters =
        &reg.gauge("chargeguard_dead_letters_dismissed", "Dead letters closed by dead-letters dismiss")
             .Add({});
    st_->errors = &reg.counter("chargeguard_billing_pending_age_errors_total",
                               "Failed queries of the oldest pending billing record")
                       .Add({});
}

pending_age_monitor::~pending_age_monitor() {
    st_->task.request_stop();
}

void pending_age_monitor::start(asio::any_io_executor ex) {
    net::job_spec job;
    job.name = "pending age monitor";
    job.interval = st_->interval;
    // The first query waits a moment: `consume --migrate` creates the table right after startup.
    job.first_after = std::min(st_->interval, std::chrono::milliseconds(1000));
    job.metrics = st_->reg;
    st_->task.start_job(
        ex, st_, std::move(job), [st = st_] { return query_pass(st); }, st_->log);
}

void pending_age_monitor::watch_abandoned(std::chrono::milliseconds bound) {
    st_->abandoned_after_ms = static_cast<std::int64_t>(bound.count());
}

net::awaitable<void> pending_age_monitor::stop() {
    auto st = st_;
    co_await st->task.stop();
}

std::shared_ptr<pending_age_monitor> start_pending_age_monitor(asio::any_io_executor ex,
                                                               std::shared_ptr<pg::pool> pool,
                                                               metrics::registry& reg, logger log) {
    auto m = std::make_shared<pending_age_monitor>(std::move(pool), reg, std::move(log));
    m->start(std::move(ex));
    return m;
}

}  // namespace cg::billing
