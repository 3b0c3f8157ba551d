// Where and how to connect: a libpq conninfo string or URI (--pg-dsn) merged over libpq's own defaults
// (PG* environment variables), split into the server endpoints we resolve ourselves and the other keywords
// we hand to PQconnectStartParams.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.hpp"

namespace cg::pg {

struct endpoint {
    std::string host;      // a name to resolve with Asio, an IP literal, or a Unix socket directory ("/…")
    std::string hostaddr;  // numeric address given by the user (skips resolution), or empty
    std::string port;      // as given (libpq accepts a service name too; we require digits)

    bool is_unix_socket() const { return !host.empty() && (host[0] == '/' || host[0] == '@'); }
};

struct config {
    // Keywords for PQconnectStartParams except host/hostaddr/port, in a stable order.
    std::vector<std::pair<std::string, std::string>> keywords;
    // Tried in order, as libpq would (each resolved name may give several addresses).
    std::vector<endpoint> endpoints;
    // Per attempt (libpq's connect_timeout, which PQconnectPoll itself ignores). Default 10 s.
    std::chrono::milliseconds connect_timeout{10000};
    // The DSN string itself carried a password (callers refuse that on a command line: secrets never come
    // from argv). PGPASSWORD and ~/.pgpass do not count.
    bool dsn_has_password = false;

    // Parses `dsn` (conninfo "host=… dbname=…" or URI "postgresql://…"); missing keywords come from libpq's
    // defaults, i.e. the PG* environment variables. An empty dsn means "environment only". Call once at
    // startup: libpq may read the service file here.
    static result<config> from_dsn(std::string_view dsn);

    // The value of a keyword, or "".
    std::string_view get(std::string_view keyword) const;
    void set(std::string_view keyword, std::string value);

    // "host=… port=… dbname=… user=…" for logs and errors; never the password.
    std::string describe() const;
};

}  // namespace cg::pg
