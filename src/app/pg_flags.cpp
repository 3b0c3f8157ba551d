#include "app/pg_flags.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "app/cli.hpp"

namespace cg::app {
namespace {

std::chrono::milliseconds to_ms(double seconds) {
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

}  // namespace

void add_pg_flags(CLI::App& cmd, pg_flags& f, bool long_running) {
    // All connection settings: from CHARGEGUARD_<FLAG> in every subcommand.
    auto conn = [](CLI::Option* o) { env(o->group(group_pg), env_scope::connection); };
    conn(cmd.add_option(
        "--pg-dsn", f.dsn,
        "PostgreSQL conninfo (\"host=… dbname=…\") or URI; unset keywords come from PGHOST, PGPORT, "
        "PGUSER, PGDATABASE, … as libpq defines them. Passwords: PGPASSWORD or ~/.pgpass"));
    conn(cmd.add_option(
        "--migrations-dir", f.migrations_dir,
        "read migrations/NNNN_name.sql from this directory instead of the ones built into the binary"));
    if (!long_running) return;
    conn(cmd.add_flag("--migrate", f.migrate,
                      "apply pending migrations at startup (under the migration lock)"));
    conn(cmd.add_option("--pg-pool-size", f.pool_size, "PostgreSQL connections")
             ->check(CLI::Range(1, 256))
             ->capture_default_str());
    conn(add_duration_option(cmd, "--pg-query-timeout", f.query_timeout_s,
                             "time before a statement is cancelled", 0.001, 3600.0));
    conn(add_duration_option(cmd, "--pg-acquire-timeout", f.acquire_timeout_s,
                             "time to wait for a free PostgreSQL connection before giving up", 0.0, 600.0));
    conn(add_duration_option(
        cmd, "--pg-startup-timeout", f.startup_timeout_s,
        "how long startup keeps retrying while PostgreSQL is unreachable or starting (first "
        "connection and --migrate) before exiting 1; /readyz says what it waits for",
        0.0, 86400.0));
}

pg::config to_pg_config(const pg_flags& f) {
    auto cfg = pg::config::from_dsn(f.dsn);
    if (!cfg) {
        // pg::config's message starts with the flag's name: say where the value came from instead.
        auto why = cfg.err().message;
        if (why.rfind("--pg-dsn: ", 0) == 0) why.erase(0, 10);
        if (value_origin("--pg-dsn", f.dsn).rfind("CHARGEGUARD_", 0) == 0)
            throw config_error("CHARGEGUARD_PG_DSN: " + why);
        throw usage_error("--pg-dsn: " + why);
    }
    if (cfg->dsn_has_password) {
        const char* env = std::getenv(env_name_for("CHARGEGUARD_", "pg-dsn").c_str());
        if (!env || f.dsn != env)
            throw CLI::ValidationError(
                "--pg-dsn",
                "the DSN carries a password on the command line, where every local user can "
                "read it: use PGPASSWORD, ~/.pgpass, or the CHARGEGUARD_PG_DSN variable");
    }
    return std::move(*cfg);
}

pg::pool_options to_pool_options(const pg_flags& f) {
    pg::pool_options o;
    o.server = to_pg_config(f);
    o.size = f.pool_size;
    o.conn.query_timeout = to_ms(f.query_timeout_s);
    o.acquire_timeout = to_ms(f.acquire_timeout_s);
    return o;
}

std::string timestamp_or_dash(const std::optional<pg::timestamp>& t) {
    return t ? pg::format_timestamptz(*t) : "-";
}

result<std::vector<pg::migration>> load_migrations(const pg_flags& f) {
    if (!f.migrations_dir.empty()) return pg::load_migrations(f.migrations_dir);
    return pg::embedded_migrations();
}

std::shared_ptr<pg::pool> start_pool(runtime& rt, const pg_flags& f, bool close_on_shutdown,
                                     std::size_t max_waiters, bool watch_failover,
                                     std::string failover_record) {
    auto opts = to_pool_options(f);
    opts.watch_failover = watch_failover;
    opts.failover_record = std::move(failover_record);
    if (max_waiters > 0) opts.max_waiters = std::max(opts.max_waiters, max_waiters);
    auto p = pg::pool::create(rt.io().get_executor(), rt.offload().get_executor(), std::move(opts), rt.log(),
                              &rt.metrics());
    p->add_readiness_check(rt.health());
    if (close_on_shutdown) rt.on_shutdown([p]() { return p->close(); });
    p->start();
    return p;
}

net::awaitable<result<void>> migrate_if_requested(pg::pool& p, const pg_flags& f,
                                                  const std::vector<pg::migration>& ms, logger log) {
    if (!f.migrate) co_return result<void>{};
    auto c = co_await p.acquire();
    if (!c) co_return c.err();
    auto rep = co_await pg::migrate(**c, ms, {}, log);
    if (!rep) {
        c->discard();  // it may still hold the lock or a transaction
        co_return rep.err();
    }
    log.info("migrations up to date",
             {{"applied", rep->applied.size()}, {"already_applied", rep->already_applied}});
    co_return result<void>{};
}

int run_then_close_pool(asio::io_context& io, std::shared_ptr<pg::pool> pool, net::awaitable<int> task,
                        std::string_view command) {
    int rc = exit_failure;
    asio::co_spawn(io, std::move(task), [&rc, command](std::exception_ptr e, int r) {
        if (e) {
            std::fprintf(stderr, "chargeguard %.*s: %s\n", static_cast<int>(command.size()), command.data(),
                         describe_exception(e).c_str());
            r = exit_failure;
        }
        rc = r;
    });
    io.run();
    io.restart();
    asio::co_spawn(io, pool->close(), [command](std::exception_ptr e) {
        if (!e) return;
        std::fprintf(stderr, "chargeguard %.*s: closing the PostgreSQL pool: %s\n",
                     static_cast<int>(command.size()), command.data(), describe_exception(e).c_str());
    });
    io.run();
    return rc;
}

namespace {

// What startup waits for, for /readyz: shared with the readiness check, which may outlive the wait.
struct startup_state {
    std::mutex mu;
    bool done = false;
    std::string waiting_for = "PostgreSQL (first connection)";
};

// One try: a working connection, then the migrations when asked.
net::awaitable<result<void>> connect_and_migrate(pg::pool& p, const pg_flags& f,
                                                 const std::vector<pg::migration>& ms, logger log) {
    if (f.migrate) co_return co_await migrate_if_requested(p, f, ms, std::move(log));
    auto c = co_await p.acquire();
    if (!c) co_return c.err();
    co_return result<void>{};
}

}  // namespace

net::awaitable<result<void>> wait_for_postgres(runtime& rt, pg::pool& p, const pg_flags& f,
                                               const std::vector<pg::migration>& ms) {
    using namespace std::chrono;
    auto st = std::make_shared<startup_state>();
    // Past PostgreSQL, "started" only once /startupz is: a /readyz that says "ok startup" while /startupz
    // still waits (for NSQ, say) would tell an operator the opposite of the startup probe.
    rt.health().add_readiness("startup", [st, s = &rt.startup()]() -> metrics::check_status {
        {
            std::lock_guard lk(st->mu);
            if (!st->done) return {false, "waiting for " + st->waiting_for, "waiting for PostgreSQL"};
        }
        if (s->started()) return {true, "started", "started"};
        return {false, "waiting for /startupz", "waiting for /startupz"};
    });
    auto finish = [&st] {
        std::lock_guard lk(st->mu);
        st->done = true;
    };
    const auto deadline = steady_clock::now() + to_ms(f.startup_timeout_s);
    std::mt19937_64 rng(std::random_device{}());
    milliseconds delay{250};
    net::steady_timer timer(co_await asio::this_coro::executor);
    for (int attempt = 1;; ++attempt) {
        auto r = co_await connect_and_migrate(p, f, ms, rt.log());
        if (r) {
            finish();
            if (attempt > 1) rt.log().info("PostgreSQL is answering: starting", {{"attempts", attempt}});
            co_return r;
        }
        // Jittered in [delay/2, delay], doubling up to 5 s, so restarted sidecars do not retry in lockstep.
        auto wait = milliseconds(delay.count() / 2 + static_cast<milliseconds::rep>(
                                                         std::uniform_real_distribution<double>(0, 0.5)(rng) *
                                                         static_cast<double>(delay.count())));
        if (!pg::is_transient(r.code()) || rt.stopping() || steady_clock::now() + wait > deadline)
            co_return r;
        std::string what = f.migrate ? "PostgreSQL to apply migrations" : "PostgreSQL (first connection)";
        {
            std::lock_guard lk(st->mu);
            st->waiting_for = what + " (attempt " + std::to_string(attempt) + ": " + r.err().describe() + ")";
        }
        rt.log().warn(
            "waiting for PostgreSQL before starting",
            {{"error", r.err().describe()},
             {"attempt", attempt},
             {"retry_in_ms", static_cast<std::int64_t>(wait.count())},
             {"gives_up_in_s",
              static_cast<std::int64_t>(duration_cast<seconds>(deadline - steady_clock::now()).count())}});
        timer.expires_after(wait);
        co_await timer.async_wait();
        delay = std::min(delay * 2, milliseconds(5000));
    }
}

}  // namespace cg::app
