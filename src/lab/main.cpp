// chargeguard-lab: the failure modes of an NSQ → Stripe consumer, reproduced side by side with the fix.
// Each scenario runs an unsafe consumer (the real NSQ consumer and Stripe client with a bad key, a
// blocking call, no TOUCH, or the ledger without the content key) and then the real billing pipeline,
// against the same delivery history, and prints what Stripe ended up with.
//
// Needs PostgreSQL (libpq's PG* variables; a database `chargeguard_lab_<pid>` is created and dropped),
// fake-nsqd and fake-stripe (built beside the lab), and optionally the real nsqd (--nsqd-bin / NSQD_BIN).
#include <libpq-fe.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "lab/lab.hpp"
#include "net/offload.hpp"

#ifndef LAB_FAKE_NSQD
#define LAB_FAKE_NSQD "fake-nsqd"
#endif
#ifndef LAB_FAKE_STRIPE
#define LAB_FAKE_STRIPE "fake-stripe"
#endif
#ifndef LAB_CERTS_DIR
#define LAB_CERTS_DIR ""
#endif

namespace {

using namespace cg;

// Synchronous libpq, before the event loop runs (or after it stopped): create or drop the lab's database.
void admin_exec(const std::string& sql) {
    PGconn* c = PQconnectdb("dbname=postgres");
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);  // "does not exist, skipping"
    std::string err;
    if (PQstatus(c) != CONNECTION_OK) {
        err = PQerrorMessage(c);
    } else {
        PGresult* r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) != PGRES_COMMAND_OK) err = PQresultErrorMessage(r);
        PQclear(r);
    }
    PQfinish(c);
    if (!err.empty()) throw std::runtime_error(sql + ": " + err);
}

struct run_state {
    std::vector<lab::row> rows;
    std::string failure;
};

asio::awaitable<void> run_all(lab::lab* l, std::vector<const lab::scenario*> scenarios, run_state* st) {
    if (auto r = co_await l->start(); !r) {
        st->failure = "cannot start the lab: " + r.err().describe();
        co_await l->stop();
        co_return;
    }
    std::exception_ptr failed;
    try {
        for (const auto* s : scenarios) {
            auto rows = co_await l->run(*s);
            for (auto& r : rows) st->rows.push_back(std::move(r));
        }
    } catch (...) {
        failed = std::current_exception();
    }
    co_await l->stop();
    if (failed) std::rethrow_exception(failed);
}

std::string env_or(const char* name, std::string fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "chargeguard-lab: NSQ/Stripe failure modes, unsafe consumers side by side with the pipeline"};
    std::string only, level = "error";
    bool json = false, list = false, fake_only = false;
    lab::lab_options o;
    o.nsqd_bin = env_or("NSQD_BIN", "");
    o.fake_nsqd_bin = env_or("FAKE_NSQD_BIN", LAB_FAKE_NSQD);
    o.fake_stripe_bin = env_or("FAKE_STRIPE_BIN", LAB_FAKE_STRIPE);
    o.certs_dir = env_or("CG_TEST_CERTS", LAB_CERTS_DIR);
    app.add_option("--scenario", only, "run one scenario (see --list)");
    app.add_flag("--json", json, "print the rows as a JSON array instead of the table");
    app.add_flag("--list", list, "list the scenarios and exit");
    app.add_option("--nsqd-bin", o.nsqd_bin, "the real nsqd (default: $NSQD_BIN); FM2b, FM3, FM3b run on it")
        ->capture_default_str();
    app.add_flag("--fake-nsqd-only", fake_only, "ignore the real nsqd even when one is given");
    app.add_option("--fake-nsqd-bin", o.fake_nsqd_bin)->capture_default_str();
    app.add_option("--fake-stripe-bin", o.fake_stripe_bin)->capture_default_str();
    app.add_option("--certs-dir", o.certs_dir, "test PKI: ca.pem, server.pem, server.key")
        ->capture_default_str();
    app.add_option("--log-level", level, "debug, info, warn, error, off (JSON lines on stderr)")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    if (fake_only) o.nsqd_bin.clear();

    if (list) {
        for (const auto& s : lab::all_scenarios()) std::printf("%-20s %s\n", s.name.c_str(), s.what.c_str());
        return 0;
    }
    std::vector<const lab::scenario*> scenarios;
    if (only.empty()) {
        for (const auto& s : lab::all_scenarios()) scenarios.push_back(&s);
    } else if (const auto* s = lab::find_scenario(only)) {
        scenarios.push_back(s);
    } else {
        std::fprintf(stderr, "chargeguard-lab: unknown scenario '%s' (see --list)\n", only.c_str());
        return 2;
    }
    for (const auto& p : {o.fake_nsqd_bin, o.fake_stripe_bin}) {
        if (::access(p.c_str(), X_OK) != 0) {
            std::fprintf(stderr, "chargeguard-lab: %s is not an executable (build the test doubles)\n",
                         p.c_str());
            return 2;
        }
    }
    if (!o.nsqd_bin.empty() && ::access(o.nsqd_bin.c_str(), X_OK) != 0) {
        std::fprintf(stderr, "chargeguard-lab: --nsqd-bin %s is not an executable\n", o.nsqd_bin.c_str());
        return 2;
    }
    if (!std::filesystem::exists(o.certs_dir + "/server.pem")) {
        std::fprintf(stderr, "chargeguard-lab: no test certificates in '%s' (--certs-dir)\n",
                     o.certs_dir.c_str());
        return 2;
    }
    auto lvl = level == "debug"   ? log_level::debug
               : level == "info"  ? log_level::info
               : level == "error" ? log_level::error
               : level == "off"   ? log_level::off
                                  : log_level::warn;
    logger log(std::make_shared<fd_sink>(2), lvl);

    char tmpl[] = "/tmp/chargeguard-lab.XXXXXX";
    if (!::mkdtemp(tmpl)) {
        std::perror("mkdtemp");
        return 1;
    }
    o.work_dir = tmpl;
    const std::string db = "chargeguard_lab_" + std::to_string(::getpid());
    try {
        admin_exec("DROP DATABASE IF EXISTS " + db);
        admin_exec("CREATE DATABASE " + db);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chargeguard-lab: PostgreSQL (PG* variables): %s\n", e.what());
        return 1;
    }
    auto pgc = pg::config::from_dsn("dbname=" + db);
    if (!pgc) {
        std::fprintf(stderr, "chargeguard-lab: %s\n", pgc.err().describe().c_str());
        return 1;
    }
    o.pg = *pgc;

    run_state st;
    {
        net::loop_pair loops{2};
        auto& io = loops.io;
        lab::lab l(io, loops.offload, o, log);
        asio::co_spawn(io, run_all(&l, scenarios, &st), [&st](std::exception_ptr e) {
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                st.failure = ex.what();
            }
        });
        io.run();
        loops.shut_down();  // the handlers left on either loop go while the lab they refer to exists
    }
    try {
        admin_exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chargeguard-lab: %s\n", e.what());
    }
    std::error_code ec;
    std::filesystem::remove_all(o.work_dir, ec);
    if (!st.failure.empty()) {
        std::fprintf(stderr, "chargeguard-lab: %s\n", st.failure.c_str());
        return 1;
    }
    if (json) {
        std::fputs(lab::render_json(st.rows).c_str(), stdout);
        return 0;
    }
    std::fputs(lab::render_table(st.rows).c_str(), stdout);
    std::string real_list;
    for (const auto* s : scenarios)
        if (s->real_broker) real_list += (real_list.empty() ? "" : ", ") + s->name;
    if (o.nsqd_bin.empty() || real_list.empty())
        std::printf("\nbroker: fake-nsqd for every scenario");
    else
        std::printf("\nbroker: the real nsqd (%s) for %s; fake-nsqd for the rest", o.nsqd_bin.c_str(),
                    real_list.c_str());
    std::printf(". msg_timeout %lld ms; heartbeat 1 s unless stated.\n",
                static_cast<long long>(o.msg_timeout.count()));
    std::printf(
        "unsafe = the real NSQ consumer and Stripe client with the mistake below; safe = the billing "
        "pipeline as `chargeguard consume` runs it.\n\n");
    for (const auto* s : scenarios) std::printf("%-20s %s\n", s->name.c_str(), s->what.c_str());
    if (auto notes = lab::render_vault_notes(st.rows); !notes.empty()) {
        std::printf(
            "\n+cap C/P: through the vault proxy, C cents charged at Stripe against the vault key's cap of P "
            "cents.\n");
        std::fputs(notes.c_str(), stdout);
    }
    bool noted = false;
    for (const auto& r : st.rows) {
        if (r.disconnects == 0) continue;
        if (!noted) std::printf("\n");
        noted = true;
        std::printf(
            "%s %s: nsqd closed %llu connection(s) while the consumer ran (a connection whose heartbeats go "
            "unanswered for two intervals is dropped)\n",
            r.scenario.c_str(), r.variant.c_str(), static_cast<unsigned long long>(r.disconnects));
    }
    return 0;
}
