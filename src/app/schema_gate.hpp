// The schema gate of the long-running commands (consume, proxy): before live work, the database must hold
// every migration this binary was built with; a database a newer release migrated (a rollback) is accepted
// only when those newer migrations declared this binary's schema compatible (pg::migration::
// compatible_down_to). Metrics chargeguard_schema_version / _required_version / _ok, readiness check
// "schema" and startup condition "schema" report it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "app/runtime.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"

namespace cg::app {

struct schema_gate_options {
    // How often a database that is too old is looked at again while startup waits.
    std::chrono::milliseconds wait_interval{2000};
    // How often the schema is re-read once work runs (metrics, readiness and a log line on a change).
    std::chrono::milliseconds recheck_interval{60'000};
};

// Registers the metrics, readiness check "schema" and startup condition "schema" on `rt` (call before
// rt.start()), then — once awaited — reads the schema:
//  - older than this binary: waits (logging what is missing), re-reading every wait_interval, because a
//    migrate Job or another replica's --migrate may be about to apply it; exiting would only restart the
//    pod into the same wait, and consuming would fail every delivery's first ledger write;
//  - newer and declared compatible, or current: returns success, and keeps re-reading every
//    recheck_interval in the background until the runtime stops;
//  - newer and not declared compatible: returns an error (bad_migration) at once: waiting cannot help, and
//    this binary's SQL may not match the schema.
// PostgreSQL errors while waiting are retried. Also returns an error once the runtime is stopping.
// Completes on the runtime's main executor; `rt` must outlive it (the pool is kept by the background task).
class schema_gate {
  public:
    schema_gate(runtime& rt, std::shared_ptr<pg::pool> pool, std::vector<pg::migration> ms,
                schema_gate_options opts = {});
    net::awaitable<result<void>> wait();

    struct state;

  private:
    runtime& rt_;
    std::shared_ptr<state> st_;
};

struct pg_flags;

// The start of a long-running command's live work: PostgreSQL (and --migrate, if asked) as
// wait_for_postgres waits for it — retrying while it is down or starting, up to --pg-startup-timeout —,
// the startup condition "postgres", then the schema gate. True when work may start; false when the process
// is stopping, or was asked to stop with 1 (logged: migrations failed, PostgreSQL unreachable, or a schema
// newer than this binary and not declared compatible). Main executor.
net::awaitable<bool> database_ready(runtime& rt, pg::pool& pool, const pg_flags& pgf,
                                    std::vector<pg::migration> ms, schema_gate& gate);

// A service's first startup step (runtime::start_and_run): database_ready, then — when work may start —
// `start` (the consumer, or the listener and what it serves). Main executor; `rt`, `pool`, `pgf` and `gate`
// must outlive it.
net::awaitable<void> start_when_ready(runtime* rt, pg::pool* pool, const pg_flags* pgf,
                                      std::vector<pg::migration> ms, schema_gate* gate,
                                      std::function<void()> start);

}  // namespace cg::app
