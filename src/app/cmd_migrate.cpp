// `chargeguard migrate [--dry-run]`: applies the migrations in order, once each, under an advisory lock, so
// several instances starting together are safe.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <memory>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/pg_flags.hpp"
#include "net/offload.hpp"
#include "pg/connection.hpp"

namespace cg::app {
namespace {

struct migrate_flags {
    pg_flags pg;
    bool dry_run = false;
    double lock_timeout_s = 120;
};

net::awaitable<int> run_migrate(const migrate_flags& f, const pg::config& cfg,
                                const std::vector<pg::migration>& ms, asio::any_io_executor offload,
                                logger log) {
    auto c = co_await pg::connection::connect(cfg, offload, {}, log);
    if (!c) {
        std::fprintf(stderr, "chargeguard migrate: %s (%s)\n", c.err().describe().c_str(),
                     cfg.describe().c_str());
        co_return 1;
    }
    pg::migrate_options opts;
    opts.dry_run = f.dry_run;
    opts.lock_timeout = std::chrono::milliseconds(static_cast<long long>(f.lock_timeout_s * 1000));
    auto rep = co_await pg::migrate(**c, ms, opts, log);
    if (!rep) {
        std::fprintf(stderr, "chargeguard migrate: %s\n", rep.err().describe().c_str());
        co_return 1;
    }
    for (const auto& name : rep->applied)
        std::printf("%s %s\n", f.dry_run ? "would apply" : "applied", name.c_str());
    for (int v : rep->unknown_versions)
        std::fprintf(
            stderr, "chargeguard migrate: warning: the database has migration %04d, unknown to this binary\n",
            v);
    std::printf("%zu %s, %zu already applied\n", rep->applied.size(), f.dry_run ? "pending" : "applied",
                rep->already_applied);
    co_return 0;
}

int migrate_main(const migrate_flags& f, const global_flags& g) {
    auto log = make_stderr_logger(g.level());
    auto cfg = to_pg_config(f.pg);
    auto ms = load_migrations(f.pg);
    if (!ms) {
        std::fprintf(stderr, "chargeguard migrate: %s\n", ms.err().describe().c_str());
        return 1;
    }
    asio::io_context io{1};
    net::offload_pool offload{1};
    int rc = 1;
    asio::co_spawn(io, run_migrate(f, cfg, *ms, offload.get_executor(), log),
                   [&rc](std::exception_ptr e, int r) {
                       if (e) std::rethrow_exception(e);
                       rc = r;
                   });
    io.run();
    offload.drain();  // let PQfinish run
    return rc;
}

}  // namespace

void register_migrate(CLI::App& app, command_main& selected) {
    auto f = std::make_shared<migrate_flags>();
    auto* cmd =
        app.add_subcommand("migrate", "apply migrations/*.sql in order, once each, under an advisory lock");
    service_command(*cmd);  // runs as the deployment's init container, configured like consume
    cmd->footer(
        "Examples:\n"
        "  chargeguard migrate --dry-run          (PGHOST, PGUSER, PGDATABASE from the environment)\n"
        "  chargeguard migrate --pg-dsn 'host=db dbname=billing' --lock-timeout 5m\n");
    add_pg_flags(*cmd, f->pg, false);
    cmd->add_flag("--dry-run", f->dry_run, "list the migrations that would be applied; change nothing");
    add_duration_option(*cmd, "--lock-timeout", f->lock_timeout_s,
                        "time to wait for another migrate run to finish", 0.1, 3600.0);
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return migrate_main(*f, g); }; });
}

}  // namespace cg::app
