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

// The advisory lock key migrations use ("cgmigrat" as a big-endian integer).
inline constexpr long long migration_lock_key = 0x63676d6967726174LL;

}  // namespace cg::pg
