// PostgreSQL flags shared by the subcommands that talk to PostgreSQL (migrate now; consume, proxy, vault,
// reconcile later): --pg-dsn, --migrations-dir, and for long-running ones --migrate and the pool knobs.
#pragma once

#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/runtime.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/config.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "pg/types.hpp"

namespace cg::app {

struct pg_flags {
    std::string dsn;             // libpq conninfo or URI; empty: libpq's PG* environment variables
    std::string migrations_dir;  // empty: the migrations compiled into the binary
    bool migrate = false;        // long-running commands: apply migrations before serving
    std::size_t pool_size = 4;
    double query_timeout_s = 5;
    double acquire_timeout_s = 1;
    double startup_timeout_s = 300;  // how long startup waits for PostgreSQL (first connection, --migrate)
};

// Adds --pg-dsn and --migrations-dir; with `long_running` also --migrate, --pg-pool-size,
// --pg-query-timeout, --pg-acquire-timeout. (CHARGEGUARD_<FLAG> env vars come from mirror_env.)
void add_pg_flags(CLI::App& cmd, pg_flags& f, bool long_running);

// The server configuration: --pg-dsn over libpq's PG* defaults. Throws CLI::ValidationError with a clear
// message when the DSN is malformed, or when it carries a password and came from the command line (use
// PGPASSWORD, ~/.pgpass, or CHARGEGUARD_PG_DSN instead: argv is visible to every local user).
pg::config to_pg_config(const pg_flags& f);
pg::pool_options to_pool_options(const pg_flags& f);

// A timestamp column of the commands' tables: "2024-01-02 03:04:05.123456+00", or "-" for none.
std::string timestamp_or_dash(const std::optional<pg::timestamp>& t);

// The migrations to apply: --migrations-dir when given (read once, now), else the embedded ones.
result<std::vector<pg::migration>> load_migrations(const pg_flags& f);

// For long-running subcommands: creates the pool on the runtime's main loop with its metrics, registers the
// "postgres" readiness check and (with `close_on_shutdown`) a shutdown step that closes the pool, and starts
// it (first connection and health checks in the background). Shutdown steps run concurrently: a command
// whose other drains still need the pool (consume: in-flight messages) passes false and closes it itself
// after them. Throws CLI::ValidationError for a bad DSN.
// `max_waiters` (0: the pool's default) bounds the callers that may queue for a connection: a command whose
// concurrency is bounded elsewhere (consume: --max-in-flight deliveries, each waiting for at most one
// connection at a time) passes that bound, so a busy pool queues them rather than failing them.
// `watch_failover`: pg::pool_options::watch_failover (consume, whose sweeper heals what a failover lost);
// `failover_record`: pg::pool_options::failover_record (consume: its key namespace).
std::shared_ptr<pg::pool> start_pool(runtime& rt, const pg_flags& f, bool close_on_shutdown = true,
                                     std::size_t max_waiters = 0, bool watch_failover = false,
                                     std::string failover_record = {});

// For long-running subcommands: when --migrate was given, applies `ms` on a connection from `p` before the
// command starts serving. Returns the first error. Completes on the pool's executor; `p`, `f` and `ms` must
// outlive the call.
net::awaitable<result<void>> migrate_if_requested(pg::pool& p, const pg_flags& f,
                                                  const std::vector<pg::migration>& ms, logger log);

// For long-running subcommands, before they start serving: waits until PostgreSQL answers (a connection
// from `p` works) and, with --migrate, the migrations are applied — retrying transient failures (server
// down, starting up, restarting, a lost connection) with capped, jittered backoff for up to
// --pg-startup-timeout, and logging why each time. While it waits, readiness check "startup" on the
// runtime's health says what it waits for. Returns the last error when the wait runs out, the first
// permanent error (a migration that fails), or an error when the runtime is stopping. Completes on the
// pool's executor (the runtime's main loop); `rt`, `p`, `f` and `ms` must outlive the call.
// For one-shot subcommands (reconcile, dead-letters): runs `task` to completion on `io`, then closes `pool`
// on the same loop. Returns the task's exit code; an exception out of the task is printed on stderr as
// "chargeguard <command>: <what>" and becomes exit code 1 (exit_failure). Call from the thread that owns
// `io`, with nothing else running on it.
int run_then_close_pool(asio::io_context& io, std::shared_ptr<pg::pool> pool, net::awaitable<int> task,
                        std::string_view command);

net::awaitable<result<void>> wait_for_postgres(runtime& rt, pg::pool& p, const pg_flags& f,
                                               const std::vector<pg::migration>& ms);

}  // namespace cg::app
