#include "app/schema_gate.hpp"

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <mutex>

#include "app/pg_flags.hpp"
#include "net/timeout.hpp"
#include "pg/connection.hpp"
#include "pg/error.hpp"

namespace cg::app {

struct schema_gate::state {
    std::shared_ptr<pg::pool> pool;
    std::vector<pg::migration> ms;
    schema_gate_options opts;
    logger log;
    metrics::Gauge* version = nullptr;
    metrics::Gauge* ok = nullptr;
    std::mutex mu;  // the readiness check may run on another thread
    bool known = false, passed = false;
    std::string detail = "not read yet";
};

namespace {

using verdict = pg::schema_status::verdict;

net::awaitable<result<pg::schema_status>> read_schema_once(schema_gate::state& st) {
    auto c = co_await st.pool->acquire();
    if (!c) co_return c.err();
    auto s = co_await pg::read_schema_status(**c, st.ms);
    if (!s) c->discard();
    co_return s;
}

// Publishes one reading: metrics, readiness. Returns whether the description changed.
bool publish_reading(schema_gate::state& st, const pg::schema_status& s) {
    auto v = s.judge();
    bool good = v == verdict::current || v == verdict::newer_compatible;
    st.version->Set(s.current);
    st.ok->Set(good ? 1 : 0);
    std::lock_guard lock(st.mu);
    auto d = s.describe();
    bool changed = !st.known || d != st.detail;
    st.known = true;
    st.passed = good;
    st.detail = std::move(d);
    return changed;
}

net::awaitable<void> schema_recheck_loop(std::shared_ptr<schema_gate::state> st, runtime* rt) {
    net::steady_timer t(co_await asio::this_coro::executor);
    while (!rt->stopping()) {
        t.expires_after(st->opts.recheck_interval);
        co_await t.async_wait();
        if (rt->stopping()) break;
        auto s = co_await read_schema_once(*st);
        if (!s) continue;  // PostgreSQL's own readiness check and metrics report it
        if (publish_reading(*st, *s)) {
            auto v = s->judge();
            if (v == verdict::current || v == verdict::newer_compatible)
                st->log.info("database schema changed", {{"schema", s->describe()}});
            else
                st->log.error(
                    "database schema no longer fits this binary; work continues, but ledger "
                    "statements may fail",
                    {{"schema", s->describe()}});
        }
    }
}

}  // namespace

schema_gate::schema_gate(runtime& rt, std::shared_ptr<pg::pool> pool, std::vector<pg::migration> ms,
                         schema_gate_options opts)
    : rt_(rt), st_(std::make_shared<state>()) {
    st_->pool = std::move(pool);
    st_->ms = std::move(ms);
    st_->opts = opts;
    st_->log = rt.log();
    int required = 0;
    for (const auto& m : st_->ms) required = std::max(required, m.version);
    auto& reg = rt.metrics();
    reg.gauge("chargeguard_schema_required_version", "The newest migration this binary was built with")
        .Add({})
        .Set(required);
    st_->version = &reg.gauge("chargeguard_schema_version",
                              "The newest migration applied to the database (0: none), as last read")
                        .Add({});
    st_->ok = &reg.gauge("chargeguard_schema_ok",
                         "1 when the database holds every migration this binary needs and nothing newer "
                         "that is not declared compatible; else 0")
                   .Add({});
    rt.health().add_readiness("schema", [st = st_]() {
        std::lock_guard lock(st->mu);
        // Versions only: safe to show on any listener.
        return metrics::check_status{st->passed, st->detail, st->detail};
    });
    rt.startup().require("schema", "the database schema (not read yet)");
}

net::awaitable<result<void>> schema_gate::wait() {
    auto ex = co_await asio::this_coro::executor;
    net::steady_timer t(ex);
    int attempt = 0;
    std::string last_logged;
    for (;;) {
        if (rt_.stopping()) co_return error(std::make_error_code(std::errc::operation_canceled), "stopping");
        ++attempt;
        auto s = co_await read_schema_once(*st_);
        std::string waiting;
        if (!s) {
            waiting = "PostgreSQL (reading schema_migrations: " + s.err().describe() + ")";
            rt_.startup().waiting_for("schema", "PostgreSQL, to read the schema");
            if (waiting != last_logged)
                rt_.log().warn("cannot read the database schema; retrying", {{"error", s.err().describe()}});
            last_logged = waiting;
        } else {
            publish_reading(*st_, *s);
            auto v = s->judge();
            if (v == verdict::newer_incompatible) co_return error(pg::errc::bad_migration, s->describe());
            if (v != verdict::older) {
                rt_.startup().mark("schema");
                rt_.log().info("database schema fits this binary", {{"schema", s->describe()}});
                asio::co_spawn(ex, schema_recheck_loop(st_, &rt_), [log = rt_.log()](std::exception_ptr e) {
                    if (e) log.error("schema re-check failed", {{"error", describe_exception(e)}});
                });
                co_return result<void>{};
            }
            rt_.startup().waiting_for("schema", s->describe());
            // Logged when what is missing changes, and every 30th look, so a long wait stays visible
            // without a line per look.
            if (s->describe() != last_logged || attempt % 30 == 0)
                rt_.log().warn(
                    "database schema is older than this binary: not starting work until it is "
                    "migrated (a migrate Job or another replica may be applying it)",
                    {{"schema", s->describe()},
                     {"retry_in_ms", static_cast<std::int64_t>(st_->opts.wait_interval.count())}});
            last_logged = s->describe();
        }
        t.expires_after(st_->opts.wait_interval);
        co_await t.async_wait();
    }
}

net::awaitable<bool> database_ready(runtime& rt, pg::pool& pool, const pg_flags& pgf,
                                    std::vector<pg::migration> ms, schema_gate& gate) {
    if (auto m = co_await wait_for_postgres(rt, pool, pgf, std::move(ms)); !m) {
        if (rt.stopping()) co_return false;
        rt.log().error(pgf.migrate ? "cannot apply migrations" : "PostgreSQL is not answering",
                       {{"error", m.err().describe()}});
        rt.request_stop(pgf.migrate ? "--migrate failed" : "PostgreSQL unreachable at startup", 1);
        co_return false;
    }
    rt.startup().mark("postgres");
    if (auto g = co_await gate.wait(); !g) {
        if (rt.stopping()) co_return false;
        rt.log().error("the database schema is newer than this binary and not declared compatible with it",
                       {{"error", g.err().describe()}});
        rt.request_stop("incompatible database schema", 1);
        co_return false;
    }
    co_return !rt.stopping();
}

net::awaitable<void> start_when_ready(runtime* rt, pg::pool* pool, const pg_flags* pgf,
                                      std::vector<pg::migration> ms, schema_gate* gate,
                                      std::function<void()> start) {
    // Awaited into a variable, not inside the if: g++ 12 built this coroutine, with the co_await of a
    // moved parameter in the condition, into one that trapped (or hung on garbage) when it resumed.
    bool ready = co_await database_ready(*rt, *pool, *pgf, std::move(ms), *gate);
    if (!ready) co_return;
    start();
}

}  // namespace cg::app
