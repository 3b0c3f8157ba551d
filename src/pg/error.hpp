// PostgreSQL error vocabulary: pg::errc, its category, and the SQLSTATE → errc mapping.
#pragma once

#include <string_view>
#include <system_error>

namespace cg::pg {

enum class errc {
    ok = 0,
    // Reaching the server.
    unavailable,  // the pool could not hand out a connection in time (server down, pool exhausted, closed)
    connection_failed,  // connecting failed (refused, unreachable, DNS, connect timeout)
    auth_failed,        // the server rejected the credentials (28P01, 28000)
    connection_lost,    // the connection broke during an operation: its outcome is unknown
    timeout,            // the operation outlived its deadline (the query was cancelled server-side)
    canceled,           // the caller cancelled the operation; the connection was discarded
    // Statement outcomes (from SQLSTATE).
    unique_violation,        // 23505
    foreign_key_violation,   // 23503
    check_violation,         // 23514
    not_null_violation,      // 23502
    integrity_violation,     // other class 23
    serialization_failure,   // 40001
    deadlock,                // 40P01
    lock_not_available,      // 55P03
    query_canceled,          // 57014 (statement_timeout, or a cancel we did not send)
    syntax_error,            // class 42: a bug in our SQL (syntax, undefined table/column, …)
    data_exception,          // class 22 (bad input value, division by zero, …)
    insufficient_resources,  // class 53
    server_error,            // any other SQLSTATE
    pipeline_aborted,        // skipped because an earlier statement of the same pipeline batch failed
    rolled_back,             // ran, then undone because a later statement of the same (atomic) batch failed
    // Local.
    protocol_error,  // unexpected libpq state or result (a bug, or a server we do not understand)
    bad_config,      // the DSN or a flag could not be used
    bad_migration,   // a migration file or the recorded history is inconsistent
};

const std::error_category& category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), category()};
}

// Maps a five-character SQLSTATE to an error category (unknown codes → server_error).
errc errc_from_sqlstate(std::string_view sqlstate) noexcept;

// Short, stable label for metrics ("unique_violation", …).
const char* errc_name(errc e) noexcept;
// The label of any error code: errc_name for pg errors, the category name otherwise.
const char* error_class(const std::error_code& ec) noexcept;

// True for outcomes worth retrying later (server down or restarting, contention): the caller backs off
// and tries again. Constraint violations and SQL bugs are not transient.
bool is_transient(const std::error_code& ec) noexcept;

}  // namespace cg::pg

template <>
struct std::is_error_code_enum<cg::pg::errc> : std::true_type {};
