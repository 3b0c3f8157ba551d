#include "billing/pending_age.hpp"

#include <asio/co_spawn.hpp>

#include "billing/abandoned_sql.hpp"
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
    std::optional<std::int64_t> abandoned_after_ms;  // the sweep bound, once watched
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
}

net::awaitable<void> loop(state_ptr st) {
    // The first query waits a moment: `consume --migrate` creates the table right after startup.
    co_await st->task.sleep(std::min(st->interval, std::chrono::milliseconds(1000)));
    while (!st->task.stopping()) {
        co_await query_once(st);
        if (st->task.stopping()) break;
        co_await st->task.sleep(st->interval);
    }
}

}  // namespace

pending_age_monitor::pending_age_monitor(std::shared_ptr<pg::pool> pool, metrics::registry& reg, logger log,
                                         std::chrono::milliseconds interval)
    : st_(std::make_shared<state>()) {
    st_->pool = std::move(pool);
    st_->log = std::move(log);
    st_->interval = interval;
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
    st_->errors = &reg.counter("chargeguard_billing_pending_age_errors_total",
                               "Failed queries of the oldest pending billing record")
                       .Add({});
}

pending_age_monitor::~pending_age_monitor() {
    st_->task.request_stop();
}

void pending_age_monitor::start(asio::any_io_executor ex) {
    st_->task.start(ex, st_, loop(st_), st_->log, "pending age monitor");
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
