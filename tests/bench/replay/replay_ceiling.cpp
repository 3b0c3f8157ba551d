// Benchmark helper: the replay path's ceiling without NSQ — `billing::ledger::preflight` (the group-committed
// pre-flight insert and, on a conflict, the existing row) in a loop over every row already in the ledger, by
// CALLERS concurrent callers over a pool of POOL connections, the ledger's default batch options (what
// `consume` uses). Every call must conflict (the rows are there): one that inserts is counted as an error.
//
//   PG*=… replay_ceiling DBNAME [CALLERS=1000] [POOL=16] [NAMESPACE=bench]
//
// Prints one line of key=value figures (rows, seconds, cpu_s, statements, batch_rows) for replay.py.
#include <libpq-fe.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "billing/store/ledger.hpp"
#include "net/offload.hpp"
#include "pg/pool.hpp"
#include "support/process_usage.hpp"

using namespace cg;
using clock_type = std::chrono::steady_clock;

namespace {

std::vector<billing::new_record> load_rows(const std::string& db, const std::string& ns) {
    PGconn* c = PQconnectdb(("dbname=" + db).c_str());
    if (PQstatus(c) != CONNECTION_OK) std::fprintf(stderr, "connect: %s", PQerrorMessage(c)), std::exit(1);
    const char* p[1] = {ns.c_str()};
    PGresult* r = PQexecParams(c,
                               "SELECT key, customer_id, billing_period, amount_cents, currency, "
                               "stripe_customer_id, coalesce(description, '') FROM billing_records "
                               "WHERE key_namespace = $1 ORDER BY key",
                               1, nullptr, p, nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        std::fprintf(stderr, "select: %s", PQerrorMessage(c)), std::exit(1);
    std::vector<billing::new_record> rows;
    for (int i = 0; i < PQntuples(r); ++i) {
        billing::new_record rec;
        rec.key = PQgetvalue(r, i, 0);
        rec.event.customer_id = PQgetvalue(r, i, 1);
        rec.event.billing_period = PQgetvalue(r, i, 2);
        rec.event.amount_cents = std::atoll(PQgetvalue(r, i, 3));
        rec.event.currency = PQgetvalue(r, i, 4);
        rec.event.stripe_customer_id = PQgetvalue(r, i, 5);
        rec.event.description = PQgetvalue(r, i, 6);
        rec.nsq_message_id = "0123456789abcdef";
        rec.nsq_attempts = 1;
        rec.key_namespace = ns;
        rows.push_back(std::move(rec));
    }
    PQclear(r);
    PQfinish(c);
    return rows;
}

struct run_state {
    std::size_t next = 0;
    std::size_t conflicts = 0, errors = 0;
    int callers_left = 0;
};

net::awaitable<void> caller(billing::ledger& ledger, const std::vector<billing::new_record>& rows,
                            run_state& st, std::shared_ptr<pg::pool> pool) {
    while (st.next < rows.size()) {
        auto r = co_await ledger.preflight(rows[st.next++], std::chrono::seconds(30));
        (r && !r->inserted ? st.conflicts : st.errors)++;
    }
    if (--st.callers_left == 0) co_await pool->close();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: replay_ceiling DBNAME [CALLERS] [POOL] [NAMESPACE]\n");
        return 2;
    }
    std::string db = argv[1];
    int callers = argc > 2 ? std::atoi(argv[2]) : 1000;
    std::size_t pool_size = argc > 3 ? static_cast<std::size_t>(std::atoll(argv[3])) : 16;
    std::string ns = argc > 4 ? argv[4] : "bench";
    auto rows = load_rows(db, ns);
    if (rows.empty()) std::fprintf(stderr, "no rows in namespace %s\n", ns.c_str()), std::exit(1);

    asio::io_context io{1};
    net::offload_pool offload{1};
    pg::pool_options po;
    po.server = *pg::config::from_dsn("dbname=" + db);
    po.size = pool_size;
    po.max_waiters = static_cast<std::size_t>(callers) + 16;
    auto pool = pg::pool::create(io.get_executor(), offload.get_executor(), po, logger());
    pool->start();
    std::uint64_t statements = 0, batch_rows = 0;
    billing::ledger_options lo;
    lo.on_batch = [&](std::string_view, std::size_t n) {
        ++statements;
        batch_rows += n;
    };
    billing::ledger ledger(pool, std::move(lo));
    run_state st;
    st.callers_left = callers;
    auto t0 = clock_type::now();
    auto c0 = cg::test::cpu_seconds();
    for (int i = 0; i < callers; ++i)
        asio::co_spawn(io, caller(ledger, rows, st, pool), [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    io.run();
    double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    double cpu = cg::test::cpu_seconds() - c0;
    offload.drain();
    std::printf("rows=%zu conflicts=%zu errors=%zu seconds=%.4f cpu_s=%.4f statements=%llu batch_rows=%.1f\n",
                rows.size(), st.conflicts, st.errors, secs, cpu, static_cast<unsigned long long>(statements),
                statements ? static_cast<double>(batch_rows) / static_cast<double>(statements) : 0.0);
    return st.errors == 0 ? 0 : 1;
}
