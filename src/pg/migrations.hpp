// Forward-only schema migrations: migrations/NNNN_name.sql, applied in order, each in its own transaction,
// recorded in schema_migrations, serialised across instances by a PostgreSQL advisory lock.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"

namespace cg::pg {

class connection;

struct migration {
    int version = 0;
    std::string name;  // "0001_billing_records"
    std::string sql;
    std::string checksum;  // hex sha256 of sql: an applied migration must never change
    // The oldest binary schema (the newest migration a binary knows) that keeps working once this migration
    // is applied: declared in the file as a line "-- chargeguard: compatible-down-to NNNN", recorded in
    // schema_migrations, and read by older binaries deciding whether they may run on this database (a
    // rollback). Undeclared: the migration's own version (no older binary may run).
    int compatible_down_to = 0;
};

// The SQL files compiled into the binary (generated from migrations/ at build time).
struct embedded_file {
    const char* filename;
    const char* sql;
};
std::span<const embedded_file> embedded_migration_files() noexcept;

// Builds a migration from "NNNN_name.sql" and its text.
result<migration> make_migration(std::string_view filename, std::string sql);
// The embedded migrations, in order.
result<std::vector<migration>> embedded_migrations();
// Reads every NNNN_name.sql in `dir` (synchronous file reads: call at startup, before the loop runs).
result<std::vector<migration>> load_migrations(const std::string& dir);
// Versions strictly increasing, names unique.
result<void> check_sequence(const std::vector<migration>& ms);

struct migrate_options {
    bool dry_run = false;  // report what would be applied; change nothing
    // How long to wait for another instance's run to finish (it holds the advisory lock).
    std::chrono::milliseconds lock_timeout{std::chrono::minutes(2)};
    // Per migration (a big CREATE INDEX can take a while).
    std::chrono::milliseconds statement_timeout{std::chrono::minutes(10)};
};

struct migrate_report {
    std::vector<std::string> applied;  // applied by this run (dry run: would be applied)
    std::size_t already_applied = 0;
    std::vector<int> unknown_versions;  // in schema_migrations but not in this binary (a newer release ran)
};

// Applies the migrations `ms` not yet recorded, in order, each with its schema_migrations row in one
// transaction, under pg_advisory_lock so concurrent runs apply each migration once. Refuses (errc::
// bad_migration) when an applied migration's checksum differs from `ms`. Returns what it did. Completes on
// the connection's executor; `c` and `ms` must outlive the call. On error the lock is released (or the
// connection is broken, which releases it).
net::awaitable<result<migrate_report>> migrate(connection& c, const std::vector<migration>& ms,
                                               migrate_options opts, logger log);

// What a binary with migrations `ms` finds in the database.
struct schema_status {
    int current = 0;           // the highest version applied (0: none, or no schema_migrations table)
    int required = 0;          // the highest version in `ms`
    std::vector<int> missing;  // in `ms`, not applied: the database is older than this binary
    std::vector<int> newer;    // applied, not in `ms`: a newer release migrated it
    // Of `newer`, the highest compatible_down_to declared (or recorded as unknown: the version itself).
    int newer_needs_at_least = 0;

    enum class verdict { current, older, newer_compatible, newer_incompatible };
    verdict judge() const;
    // One line for logs, /readyz and errors: versions only, never hosts.
    std::string describe() const;
};

// Reads schema_migrations (read-only; no lock). Completes on the connection's executor; `c` and `ms` must
// outlive the call.
net::awaitable<result<schema_status>> read_schema_status(connection& c, const std::vector<migration>& ms);

// The advisory lock key migrations use ("cgmigrat" as a big-endian integer).
inline constexpr long long migration_lock_key = 0x63676d6967726174LL;

}  // namespace cg::pg
