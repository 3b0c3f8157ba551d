// Shared by the PostgreSQL integration tests: the server from the PG* environment (ci/lib.sh exports it),
// scratch databases, and a fixture with a main io_context and an offload pool.
#pragma once

#include <libpq-fe.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "net/offload.hpp"
#include "pg/config.hpp"
#include "pg/connection.hpp"
#include "pg/pool.hpp"
#include "support/loops.hpp"

namespace cg::test {

// The environment's server (PGHOST, PGPORT, PGUSER, PGDATABASE), optionally overriding keywords with `dsn`.
inline pg::config server_config(const std::string& dsn = "") {
    auto c = pg::config::from_dsn(dsn);
    if (!c) throw std::runtime_error(c.err().describe());
    return *c;
}

// A loopback port nobody listens on (bound, then closed): connecting to it is refused at once.
inline unsigned short closed_port() {
    asio::io_context io;
    asio::ip::tcp::acceptor a(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    auto port = a.local_endpoint().port();
    a.close();
    return port;
}

// The environment's server settings pointed at `port` on loopback (a closed_port(): PostgreSQL unreachable).
inline pg::config loopback_config(unsigned short port) {
    return server_config("host=127.0.0.1 port=" + std::to_string(port));
}

// Runs one statement with libpq's synchronous API: for setting up and tearing down, never on a loop.
inline void admin_exec(const std::string& sql, const std::string& dbname = "") {
    std::string dsn = dbname.empty() ? std::string() : "dbname=" + dbname;
    PGconn* c = PQconnectdb(dsn.c_str());
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);  // "does not exist, skipping"
    std::string err;
    if (PQstatus(c) != CONNECTION_OK) {
        err = PQerrorMessage(c);
    } else {
        PGresult* r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
            err = PQresultErrorMessage(r);
        PQclear(r);
    }
    PQfinish(c);
    if (!err.empty()) throw std::runtime_error("admin_exec(" + sql + "): " + err);
}

// A database created for one test and dropped afterwards, so tests never see each other's tables.
struct scratch_db {
    std::string name;
    explicit scratch_db(const std::string& tag) {
        static std::atomic<int> seq{0};
        name = "cg_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(seq++);
        admin_exec("DROP DATABASE IF EXISTS " + name);
        admin_exec("CREATE DATABASE " + name);
    }
    ~scratch_db() {
        try {
            admin_exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
        } catch (...) {
        }
    }
    pg::config config() const { return server_config("dbname=" + name); }
};

// The main loop and offload pool, torn down together (loops.hpp).
struct pg_fixture : loops {};

}  // namespace cg::test
