#include "billing/heal/sweeper.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <vector>

#include "billing/flow/settle_journal.hpp"
#include "billing/heal/pending_age.hpp"
#include "billing/heal/sweep_sql.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/correction_ledger.hpp"
#include "billing/store/ledger.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "pg/rows.hpp"

namespace cg::billing {

using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

struct abandoned_row {
    ledger_record rec;
    billing_event ev;
};

abandoned_row decode_abandoned(const pg::rows& r, std::size_t i) {
    abandoned_row a;
    a.rec = decode_stored_record_columns(r, i);
    // After the stored columns: the remaining lease, the epoch, then the event's other fields.
    const auto after = static_cast<int>(r.columns()) - 5;
    if (auto left = r.get<std::optional<std::int64_t>>(i, after)) a.rec.lease_remaining = milliseconds(*left);
    a.rec.lease_epoch = r.get<std::int64_t>(i, after + 1);
    a.ev.customer_id = a.rec.customer_id;
    a.ev.billing_period = a.rec.billing_period;
    a.ev.amount_cents = a.rec.amount_cents;
    a.ev.currency = a.rec.currency;
    a.ev.stripe_customer_id = a.rec.stripe_customer_id;
    a.ev.stripe_account = a.rec.stripe_account;
    a.ev.description = r.get<std::optional<std::string>>(i, after + 2).value_or("");
    a.ev.payment_method = r.get<std::optional<std::string>>(i, after + 3).value_or("");
    a.ev.off_session = r.get<std::optional<bool>>(i, after + 4).value_or(true);
    return a;
}

constexpr std::size_t foreign_slot = verdict_reason_count;  // after the verdict reasons

}  // namespace

struct sweeper::state {
    sweeper_config cfg;
    charge_flow* p = nullptr;
    std::shared_ptr<pg::pool> pool;
    logger log;
    std::array<metrics::Counter*, verdict_reason_count + 1> swept{};
    metrics::Counter* errors = nullptr;
    net::stoppable_task task;
    // after_failover: seen at failover_at; failover sweeps from failover_from (the first at once, then every
    // failover_interval) until failover_until.
    std::chrono::steady_clock::time_point failover_at{}, failover_from{}, failover_until{};
    bool failover_swept = true;  // the first failover sweep is done (or none is due)
    // after_failover: the settles the pipeline remembers are re-applied at once, before the grace.
    bool reapply_due = false;
    metrics::Counter* reapplied = nullptr;
    metrics::Counter* stale_leases = nullptr;  // leases ended by a failover sweep (end_stale_lease)
    metrics::registry* reg = nullptr;

    void count(std::size_t slot) {
        if (swept[slot]) swept[slot]->Increment();
    }
};

sweeper::sweeper(sweeper_config cfg, charge_flow& p, std::shared_ptr<pg::pool> pool, logger log,
                 metrics::registry* reg)
    : cfg_(std::move(cfg)), st_(std::make_shared<state>()) {
    st_->cfg = cfg_;
    st_->p = &p;
    st_->pool = std::move(pool);
    st_->log = log.with({{"component", "sweeper"}});
    st_->reg = reg;
    if (!reg) return;
    auto& fam = reg->counter("chargeguard_billing_swept_total",
                             "Abandoned pending ledger rows the sweeper ran, by how they ended (a verdict "
                             "reason, or foreign_namespace: left to the sidecar whose key it is)");
    // Every series from the start, so rate() alerts see zeros instead of gaps.
    for (std::size_t i = 0; i < verdict_reason_count; ++i)
        st_->swept[i] = &fam.Add({{"outcome", std::string(to_string(static_cast<verdict_reason>(i)))}});
    st_->swept[foreign_slot] = &fam.Add({{"outcome", "foreign_namespace"}});
    st_->reapplied =
        &reg->counter("chargeguard_billing_failover_reapplied_total",
                      "Settles this sidecar wrote that a PostgreSQL failover returned to pending, "
                      "re-applied from its memory of them without a Stripe call")
             .Add({});
    st_->stale_leases =
        &reg->counter("chargeguard_billing_failover_leases_ended_total",
                      "Leases on pending rows that nothing wrote since a PostgreSQL failover, ended by a "
                      "failover sweep after its grace so the row's recovery could take it")
             .Add({});
    st_->errors = &reg->counter("chargeguard_billing_sweep_errors_total",
                                "Sweeps whose query of abandoned ledger rows failed")
                       .Add({});
}

sweeper::~sweeper() {
    st_->task.request_stop();
}

namespace {

using sweeper_state_ptr = std::shared_ptr<sweeper::state>;

void count_verdict(sweeper::state& st, sweep_report& rep, const verdict& v, const logger& log);
net::awaitable<result<void>> sweep_corrections(sweeper_state_ptr st, sweep_report& rep);

// A failover sweep found `a` still leased on the new primary, though nothing wrote it since the failover
// (`since` ago): ends that lease (sweep_sql::end_stale_lease) so the recovery can take it. True when it did,
// with `a` as the statement left it; false when the row moved (its holder wrote it) or the statement failed.
net::awaitable<bool> end_stale_lease_of(sweeper_state_ptr st, abandoned_row& a, milliseconds since,
                                        const logger& log) {
    const auto remaining = a.rec.lease_remaining.value_or(milliseconds(0));
    auto r = co_await pg::exec_pooled(
        st->pool, sweep_sql::end_stale_lease(),
        pg::params(a.rec.key, a.rec.lease_epoch, static_cast<std::int64_t>(since.count())));
    if (!r) {
        log.warn("could not end a lease unwritten since the failover; the next failover sweep tries again",
                 {{"error", r.err().describe()}});
        co_return false;
    }
    if (r->size() != 1) co_return false;
    a = decode_abandoned(*r, 0);
    if (st->stale_leases) st->stale_leases->Increment();
    log.warn(
        "ended a lease nobody renewed since the PostgreSQL failover: its holder is gone (a live one renews "
        "within the grace), so the row is recovered now rather than when the lease runs out",
        {{"lease_left_ms", static_cast<std::int64_t>(remaining.count())},
         {"since_failover_ms", static_cast<std::int64_t>(since.count())}});
    co_return true;
}

net::awaitable<result<sweep_report>> sweep_rows(sweeper_state_ptr st,
                                                std::optional<milliseconds> since_failover) {
    auto& cfg = st->cfg;
    const auto& ns = st->p->config().key_namespace;
    const auto age = since_failover ? std::max(*since_failover, milliseconds(0)) : cfg.after;
    const auto began = steady::now();
    auto rows = co_await pg::exec_pooled(
        st->pool, since_failover ? sweep_sql::failed_over_rows() : sweep_sql::abandoned_rows(),
        pg::params(ns, static_cast<std::int64_t>(age.count()), static_cast<std::int64_t>(cfg.batch)));
    if (!rows) {
        if (st->errors) st->errors->Increment();
        co_return rows.err();
    }
    sweep_report rep;
    rep.found = rows->size();
    std::vector<abandoned_row> found;
    found.reserve(rows->size());
    for (std::size_t i = 0; i < rows->size(); ++i) found.push_back(decode_abandoned(*rows, i));
    for (auto& a : found) {
        if (st->task.stopping()) break;
        auto log = st->log.with({{"billing_key", a.rec.key}});
        if (base_key(ns, a.ev.customer_id, a.ev.billing_period, a.ev.stripe_account) != a.rec.key) {
            // The namespace column says ours, the key says otherwise: not ours to charge under our key.
            ++rep.foreign;
            st->count(foreign_slot);
            log.warn("abandoned row's key is not this sidecar's key for its event: left alone");
            continue;
        }
        if (since_failover && a.rec.lease_remaining && a.rec.lease_remaining->count() > 0) {
            // The failover as long ago as now: the rows before this one may have taken a while.
            const auto since = age + std::chrono::duration_cast<milliseconds>(steady::now() - began);
            auto ended = co_await end_stale_lease_of(st, a, since, log);
            if (!ended) continue;  // written since the failover: its holder is working on it
        }
        delivery d;
        d.topic = cfg.topic;
        d.channel = cfg.channel;
        d.message_id = "swept-" + a.rec.key;
        d.attempts = 1;
        d.body = to_json(a.ev);
        if (since_failover)
            log.warn(
                "sweeping a pending row after a PostgreSQL failover: its last write predates the failover "
                "and no lease is live",
                {{"since_failover_ms", static_cast<std::int64_t>(age.count())},
                 {"stripe_attempts", a.rec.stripe_attempts},
                 {"generation", a.rec.key_generation}});
        else
            log.warn("sweeping an abandoned pending row: no delivery has worked on it within the sweep bound",
                     {{"sweep_after_ms", static_cast<std::int64_t>(cfg.after.count())},
                      {"stripe_attempts", a.rec.stripe_attempts},
                      {"generation", a.rec.key_generation}});
        auto v = co_await st->p->resume(std::move(d), std::move(a.ev), std::move(a.rec));
        count_verdict(*st, rep, v, log);
    }
    if (st->task.stopping()) co_return rep;
    auto corrected = co_await sweep_corrections(st, rep);
    if (!corrected) {
        if (st->errors) st->errors->Increment();
        co_return corrected.err();
    }
    co_return rep;
}

void count_verdict(sweeper::state& st, sweep_report& rep, const verdict& v, const logger& log) {
    ++rep.by_reason[static_cast<std::size_t>(v.reason)];
    st.count(static_cast<std::size_t>(v.reason));
    std::array<log_field, 2> fields{log_field("reason", to_string(v.reason)), log_field("detail", v.detail)};
    log.log(v.finished() ? log_level::info : log_level::warn, "swept row", fields);
}

// The abandoned correction revisions, each through the corrections machine as a redelivery of its message
// would run it (charge_flow::resume_correction): the same key inside Stripe's window, the search after it.
net::awaitable<result<void>> sweep_corrections(sweeper_state_ptr st, sweep_report& rep) {
    auto& cfg = st->cfg;
    const auto& ns = st->p->config().key_namespace;
    auto rows = co_await pg::exec_pooled(
        st->pool, sweep_sql::abandoned_corrections(),
        pg::params(ns, static_cast<std::int64_t>(cfg.after.count()), static_cast<std::int64_t>(cfg.batch)));
    if (!rows) co_return rows.err();
    rep.corrections_found = rows->size();
    struct found_revision {
        std::string key, base, body;
    };
    std::vector<found_revision> found;
    for (std::size_t i = 0; i < rows->size(); ++i)
        found.push_back(
            {rows->get<std::string>(i, 0), rows->get<std::string>(i, 1), rows->get<std::string>(i, 2)});
    for (auto& c : found) {
        if (st->task.stopping()) break;
        auto log = st->log.with({{"billing_key", c.base}, {"correction_key", c.key}});
        auto ev = parse_event(c.body);
        if (!ev || !ev->is_correction() ||
            base_key(ns, ev->customer_id, ev->billing_period, ev->stripe_account) != c.base ||
            correction_key(c.base, ev->revision) != c.key) {
            ++rep.foreign;
            st->count(foreign_slot);
            log.warn(
                "abandoned correction's body does not give its keys under this sidecar's namespace: left "
                "alone");
            continue;
        }
        delivery d;
        d.topic = cfg.topic;
        d.channel = cfg.channel;
        d.message_id = "swept-" + c.key;
        d.attempts = 1;
        d.body = std::move(c.body);
        log.warn(
            "sweeping an abandoned pending correction: no delivery has worked on it within the sweep bound",
            {{"sweep_after_ms", static_cast<std::int64_t>(cfg.after.count())}});
        auto v = co_await st->p->resume_correction(std::move(d), std::move(*ev), c.base);
        count_verdict(*st, rep, v, log);
    }
    co_return result<void>{};
}

// How long to sleep before the next sweep: the regular interval, or less while failover sweeps are due.
steady::duration next_sweep_in(const sweeper::state& st) {
    const auto now = steady::now();
    steady::duration wait = st.cfg.interval;
    if (now < st.failover_from) return std::min(wait, st.failover_from - now);
    if (now >= st.failover_until) return wait;
    if (!st.failover_swept) return steady::duration::zero();
    return std::min<steady::duration>({wait, st.cfg.failover_interval, st.failover_until - now});
}

// The settles this sidecar remembers (settle_journal.hpp) whose rows the new primary shows reverted.
net::awaitable<void> reapply_settles(sweeper_state_ptr st) {
    st->reapply_due = false;
    auto rep = co_await reapply_after_failover(st->p->ledger_ref(), st->p->journal(), st->log);
    if (st->reapplied) st->reapplied->Increment(static_cast<double>(rep.reapplied));
    st->log.warn("failover: re-applied the settles it lost that this sidecar remembered",
                 {{"checked", static_cast<std::int64_t>(rep.checked)},
                  {"reapplied", static_cast<std::int64_t>(rep.reapplied)},
                  {"errors", static_cast<std::int64_t>(rep.errors)}});
}

// One pass: the settles to re-apply after a failover first, then a failover sweep or a regular one.
net::awaitable<bool> sweep_pass(sweeper_state_ptr st) {
    if (st->reapply_due) co_await reapply_settles(st);
    if (st->task.stopping()) co_return false;
    const auto now = steady::now();
    // Woken by a failover whose grace has not passed: the failover sweeps come after it (they cover every
    // row a regular sweep would take meanwhile).
    if (now < st->failover_from) co_return true;
    std::optional<milliseconds> since_failover;
    if (now < st->failover_until) {
        since_failover = std::chrono::duration_cast<milliseconds>(now - st->failover_at);
        st->failover_swept = true;
    }
    auto rep = co_await sweep_rows(st, since_failover);
    if (!rep)
        st->log.warn("sweep failed; trying again at the next interval", {{"error", rep.err().describe()}});
    else if (rep->found + rep->corrections_found > 0)
        st->log.info("sweep done",
                     {{"found", static_cast<std::int64_t>(rep->found)},
                      {"corrections_found", static_cast<std::int64_t>(rep->corrections_found)},
                      {"charged", static_cast<std::int64_t>(rep->count(verdict_reason::charged))}});
    co_return true;
}

}  // namespace

net::awaitable<result<sweep_report>> sweeper::sweep_once(std::optional<milliseconds> since_failover) {
    co_return co_await sweep_rows(st_, since_failover);
}

void sweeper::after_failover() {
    auto& st = *st_;
    derive_failover_sweeps(st.cfg, st.p->config());
    const auto now = steady::now();
    st.failover_at = now;
    st.failover_from = now + st.cfg.failover_grace;
    st.failover_until = now + st.cfg.failover_window;
    st.failover_swept = false;
    st.reapply_due = true;
    st.log.warn(
        "PostgreSQL failed over: sweeping the pending rows written before it with no live lease after "
        "the grace, then as their leases expire",
        {{"failover_grace_ms", static_cast<std::int64_t>(st.cfg.failover_grace.count())},
         {"failover_window_ms", static_cast<std::int64_t>(st.cfg.failover_window.count())},
         {"failover_interval_ms", static_cast<std::int64_t>(st.cfg.failover_interval.count())}});
    st.task.wake();
}

void sweeper::start(asio::any_io_executor ex) {
    if (st_->cfg.interval.count() <= 0) st_->cfg.interval = sweep_interval(st_->cfg.after);
    net::job_spec job;
    job.name = "sweeper";
    job.interval = st_->cfg.interval;
    // The regular interval, or less while failover sweeps are due; at once when settles are to be re-applied
    // (after_failover wakes a sleep in progress).
    job.next_wait = [st = st_.get()] {
        return st->reapply_due ? steady::duration::zero() : next_sweep_in(*st);
    };
    job.metrics = st_->reg;
    st_->task.start_job(
        ex, st_, std::move(job), [st = st_] { return sweep_pass(st); }, st_->log);
}

net::awaitable<void> sweeper::stop() {
    auto st = st_;
    co_await st->task.stop();
}

std::shared_ptr<sweeper> start_sweeper(asio::any_io_executor ex, charge_flow& p,
                                       std::shared_ptr<pg::pool> pool, sweeper_config cfg,
                                       milliseconds msg_timeout, metrics::registry& reg, logger log,
                                       pending_age_monitor* age) {
    if (cfg.after.count() <= 0) cfg.after = sweep_bound(p.config(), msg_timeout);
    if (cfg.interval.count() <= 0) cfg.interval = sweep_interval(cfg.after);
    derive_failover_sweeps(cfg, p.config());
    log.info("sweeper for abandoned pending rows",
             {{"sweep_after_ms", static_cast<std::int64_t>(cfg.after.count())},
              {"sweep_interval_ms", static_cast<std::int64_t>(cfg.interval.count())},
              {"msg_timeout_ms", static_cast<std::int64_t>(msg_timeout.count())},
              {"failover_grace_ms", static_cast<std::int64_t>(cfg.failover_grace.count())},
              {"failover_window_ms", static_cast<std::int64_t>(cfg.failover_window.count())},
              {"failover_interval_ms", static_cast<std::int64_t>(cfg.failover_interval.count())}});
    if (age) age->watch_abandoned(cfg.after);
    auto s = std::make_shared<sweeper>(std::move(cfg), p, pool, std::move(log), &reg);
    pool->on_failover([w = std::weak_ptr<sweeper>(s)](const pg::failover_event&) {
        if (auto live = w.lock()) live->after_failover();
    });
    s->start(std::move(ex));
    return s;
}

}  // namespace cg::billing
