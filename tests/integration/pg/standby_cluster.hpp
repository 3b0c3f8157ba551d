// A throwaway PostgreSQL cluster of a test's own (ci/pg-cluster) whose commits wait for a synchronous
// standby that never connects (faults_cancel_commit_test.cpp, faults_acknowledge_test.cpp). Its own, so
// nothing else ever waits on it, even if the test dies.
#pragma once

#include <libpq-fe.h>
#include <sys/stat.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>

#include "support.hpp"
#include "support/pg_server_ctl.hpp"

namespace cg::test {

struct cluster_waiting_for_a_standby : pg_server_ctl {
    unsigned short port = closed_port();
    // `waiting` false: commits do not wait until require_standby() (a schema set up first).
    explicit cluster_waiting_for_a_standby(bool waiting = true)
        : pg_server_ctl("start a cluster of the test's own") {
        char tmpl[] = "/tmp/cg-syncrep.XXXXXX";
        BOOST_TEST_REQUIRE(::mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        ::chmod(tmpl, 0755);
        BOOST_TEST_REQUIRE(run("start", std::to_string(port)) == 0);
        exec("CREATE TABLE t (id int PRIMARY KEY)");
        if (waiting) require_standby();
    }
    ~cluster_waiting_for_a_standby() {
        run("stop");
        std::system(("rm -rf \"" + dir + "\"").c_str());
    }
    cluster_waiting_for_a_standby(const cluster_waiting_for_a_standby&) = delete;
    cluster_waiting_for_a_standby& operator=(const cluster_waiting_for_a_standby&) = delete;

    // From now on every commit that wrote waits for the standby. The server applies it a moment after the
    // reload: until then commits return at once.
    void require_standby() const {
        exec("ALTER SYSTEM SET synchronous_standby_names = 'cg_no_such_standby'");
        exec("SELECT pg_reload_conf()");
    }
    int run(const std::string& what, const std::string& extra = "") const {
        return std::system(
            ("\"" + ctl + "\" " + what + " \"" + dir + "\" " + extra + " >/dev/null 2>&1").c_str());
    }
    std::string dsn() const {
        return "host=127.0.0.1 port=" + std::to_string(port) + " dbname=chargeguard_test user=postgres";
    }
    // libpq's synchronous API: for setting up and reading back, never on a loop.
    std::string exec(const std::string& sql) const {
        PGconn* c = PQconnectdb(dsn().c_str());
        PGresult* r = PQexec(c, sql.c_str());
        auto st = PQresultStatus(r);
        std::string out = st == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
        std::string err = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? "" : PQerrorMessage(c);
        PQclear(r);
        PQfinish(c);
        BOOST_TEST_REQUIRE(err.empty(), sql << ": " << err);
        return out;
    }
};

}  // namespace cg::test
