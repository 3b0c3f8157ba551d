// Benchmark: the billing pre-flight statement (INSERT … ON CONFLICT DO NOTHING RETURNING) for N distinct
// keys, one statement at a time vs pipelined, over 1, 4 and 8 connections, against pgbench running the
// same statement as a custom script at the same client count, in the same run.
//
//   PGHOST=… PGPORT=… PGUSER=… build/tests/bench/pg/pg_preflight [N=100000] [batch=500]
//
// Creates (and drops) a scratch database with the migrations applied.
#include <libpq-fe.h>
#include <sys/resource.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "net/offload.hpp"
#include "pg/connection.hpp"
#include "pg/migrations.hpp"
#include "support/process_usage.hpp"

using namespace cg;
using clock_type = std::chrono::steady_clock;

namespace {

// The statement under test, identical for chargeguard ($1) and pgbench (:k, sent as a parameter with -M
// prepared): the key is derived from the number so both sides send one integer.
const char* const preflight_sql =
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
    "stripe_customer_id, "
    "lease_until) VALUES (lpad(to_hex($1::bigint), 32, '0'), 'cus_' || $1::bigint, '2024-05', 1999, 'usd', "
    "'cus_S', now() + interval '30 seconds') ON CONFLICT DO NOTHING RETURNING key";

void admin(const std::string& sql, const std::string& db = "") {
    PGconn* c = PQconnectdb(db.empty() ? "" : ("dbname=" + db).c_str());
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        std::fprintf(stderr, "%s: %s", sql.c_str(), PQerrorMessage(c));
        std::exit(1);
    }
    PQclear(r);
    PQfinish(c);
}

std::int64_t count_rows(const std::string& db) {
    PGconn* c = PQconnectdb(("dbname=" + db).c_str());
    PGresult* r = PQexec(c, "SELECT count(*) FROM billing_records");
    std::int64_t n = std::atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
    return n;
}

struct run_state {
    int workers_left = 0;
    std::int64_t inserted = 0;
    std::int64_t errors = 0;
};

// One connection inserting keys [from, to): one statement per round trip, or pipelined batches.
net::awaitable<void> worker(pg::config cfg, asio::any_io_executor offload, std::int64_t from, std::int64_t to,
                            std::size_t batch, pg::pipeline::sync_mode mode, run_state& st) {
    pg::connection_options opts;
    opts.query_timeout = std::chrono::seconds(60);
    auto c = co_await pg::connection::connect(cfg, offload, opts);
    if (!c) {
        std::fprintf(stderr, "connect: %s\n", c.err().describe().c_str());
        std::exit(1);
    }
    auto& conn = **c;
    if (batch <= 1) {
        for (auto k = from; k < to; ++k) {
            auto r = co_await conn.query(preflight_sql, k);
            if (r && r->size() == 1)
                ++st.inserted;
            else
                ++st.errors;
        }
    } else {
        for (auto k = from; k < to;) {
            pg::pipeline p(mode);
            p.reserve(batch);
            for (std::size_t i = 0; i < batch && k < to; ++i, ++k) p.add(preflight_sql, k);
            auto r = co_await conn.run(p);
            if (!r) {
                std::fprintf(stderr, "pipeline: %s\n", r.err().describe().c_str());
                std::exit(1);
            }
            for (auto& one : *r) (one && one->size() == 1 ? st.inserted : st.errors)++;
        }
    }
    --st.workers_left;
}

struct figures {
    double seconds, cpu;
    std::int64_t inserted, errors;
};

figures run(const pg::config& cfg, net::offload_pool& offload, std::int64_t n, int conns, std::size_t batch,
            pg::pipeline::sync_mode mode, std::int64_t base) {
    asio::io_context io{1};
    run_state st;
    st.workers_left = conns;
    auto t0 = clock_type::now();
    auto c0 = cg::test::cpu_seconds();
    for (int i = 0; i < conns; ++i) {
        auto from = base + n * i / conns, to = base + n * (i + 1) / conns;
        asio::co_spawn(io, worker(cfg, offload.get_executor(), from, to, batch, mode, st),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
    }
    io.run();
    return {std::chrono::duration<double>(clock_type::now() - t0).count(), cg::test::cpu_seconds() - c0,
            st.inserted, st.errors};
}

// Runs pgbench with the same statement; returns its TPS (0 if it could not run).
double pgbench(const std::string& db, std::int64_t n, int clients, std::int64_t base,
               const std::string& script) {
    const char* bin = std::getenv("PGBENCH");
    std::string exe = bin ? bin : "/usr/lib/postgresql/15/bin/pgbench";
    int threads = clients < 2 ? clients : 2;  // the machine has 2 cores
    std::string cmd = exe + " -n -M prepared -c " + std::to_string(clients) + " -j " +
                      std::to_string(threads) + " -t " + std::to_string(n / clients) +
                      " -D base=" + std::to_string(base) + " -f " + script + " " + db + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return 0;
    char line[512];
    double tps = 0;
    std::string all;
    while (std::fgets(line, sizeof line, p)) {
        all += line;
        std::sscanf(line, "tps = %lf (without initial connection time)", &tps);
    }
    ::pclose(p);
    if (tps == 0) std::fprintf(stderr, "pgbench failed:\n%s", all.c_str());
    return tps;
}

net::awaitable<void> setup_schema(pg::config cfg, asio::any_io_executor offload) {
    auto c = co_await pg::connection::connect(cfg, offload);
    auto ms = pg::embedded_migrations();
    if (!c || !ms) std::fprintf(stderr, "setup failed\n"), std::exit(1);
    auto r = co_await pg::migrate(**c, *ms, {}, logger());
    if (!r) std::fprintf(stderr, "migrate: %s\n", r.err().describe().c_str()), std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    if (!std::getenv("PGHOST")) {
        std::fprintf(stderr, "pg_preflight: set PGHOST/PGPORT/PGUSER (see ci/lib.sh start_postgres)\n");
        return 77;
    }
    std::int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000;
    std::size_t batch = argc > 2 ? static_cast<std::size_t>(std::atoll(argv[2])) : 500;
    std::string db = "cg_bench_" + std::to_string(::getpid());
    admin("DROP DATABASE IF EXISTS " + db);
    admin("CREATE DATABASE " + db);
    auto cfg = pg::config::from_dsn("dbname=" + db);
    net::offload_pool offload{1};
    {  // schema
        asio::io_context io{1};
        asio::co_spawn(io, setup_schema(*cfg, offload.get_executor()), [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
        io.run();
    }
    std::string script = "/tmp/" + db + ".sql";
    {
        // pgbench: every transaction takes the next number of a shared sequence (distinct keys, as ours).
        std::string stmt = preflight_sql;
        stmt.replace(stmt.find("$1::bigint"), 10, ":k::bigint");
        stmt.replace(stmt.find("$1::bigint"), 10, ":k::bigint");
        std::ofstream(script) << "\\set k :base + random(1, 1000000000000)\n" << stmt << ";\n";
    }
    std::printf(
        "pre-flight INSERT … ON CONFLICT DO NOTHING RETURNING, %lld distinct keys per run, batch %zu\n",
        static_cast<long long>(n), batch);
    std::printf("%-5s %-34s %12s %9s %8s %8s\n", "conns", "mode", "inserts/s", "seconds", "cpu-s", "errors");
    std::int64_t base = 0;
    struct mode_t {
        const char* name;
        std::size_t batch;
        pg::pipeline::sync_mode sync;
    } modes[] = {{"one at a time", 1, pg::pipeline::sync_mode::per_batch},
                 {"pipelined, commit per statement", batch, pg::pipeline::sync_mode::per_statement},
                 {"pipelined, one commit per batch", batch, pg::pipeline::sync_mode::per_batch}};
    for (int conns : {1, 4, 8}) {
        double best_pipelined = 0;
        for (auto& m : modes) {
            admin("TRUNCATE billing_records", db);
            auto f = run(*cfg, offload, n, conns, m.batch, m.sync, base);
            auto rows = count_rows(db);
            double rate = static_cast<double>(f.inserted) / f.seconds;
            if (m.batch > 1 && m.sync == pg::pipeline::sync_mode::per_statement) best_pipelined = rate;
            std::printf("%-5d %-34s %12.0f %9.2f %8.2f %8lld%s\n", conns, m.name, rate, f.seconds, f.cpu,
                        static_cast<long long>(f.errors), rows == n ? "" : "  (row count mismatch!)");
            base += n;
        }
        admin("TRUNCATE billing_records", db);
        double tps = pgbench(db, n, conns, 1000000000000000LL * conns, script);
        std::printf("%-5d %-34s %12.0f\n", conns, "pgbench -M prepared (same statement)", tps);
        if (tps > 0)
            std::printf("%-5d ratio pipelined (commit per statement) / pgbench = %.2f\n", conns,
                        best_pipelined / tps);
        std::fflush(stdout);
    }
    std::printf("max RSS %ld MB\n", (cg::test::peak_rss_kib() / 1024));
    std::remove(script.c_str());
    offload.drain();
    admin("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
    return 0;
}
