// Internals shared by the files that implement pg::connection (one per job: connection.cpp state and errors,
// connect.cpp connect planning, socket_wait.cpp socket waits, statement_cache.cpp the prepared-statement
// cache, query.cpp single statements, pipeline_mode.cpp pipeline batches). Not for use outside src/pg.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <string>

#include "pg/connection.hpp"

namespace cg::pg {
namespace detail {

using clock = std::chrono::steady_clock;

// libpq's multi-line messages ("…failed: Connection refused\n\tIs the server running…") on one line.
inline std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    for (std::size_t p; (p = s.find("\n\t")) != std::string::npos;) s.replace(p, 2, " ");
    for (auto& c : s)
        if (c == '\n') c = ' ';
    return s;
}

// Zero or negative: no deadline.
inline clock::time_point deadline_after(clock::duration d) {
    return d <= clock::duration::zero() ? clock::time_point::max() : clock::now() + d;
}

}  // namespace detail

// One operation's deadline and cancel state.
struct connection::op {
    clock::time_point deadline;
    bool cancel_sent = false;
};

struct connection::io_ready {
    std::error_code ec;
    bool readable = false;
    bool writable = false;
};

// One address to try: a DSN endpoint resolved.
struct connection::attempt {
    std::string host;      // for libpq (messages, TLS name, .pgpass); empty for the default socket
    std::string hostaddr;  // numeric; empty for Unix sockets
    std::string port;
};

}  // namespace cg::pg
