#include "pg/migrations.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "pg/connection.hpp"
#include "pg/types.hpp"

namespace cg::pg {
namespace {

std::string sha256_hex(std::string_view s) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_Digest(s.data(), s.size(), md, &len, EVP_sha256(), nullptr);
    return to_hex(std::span<const std::uint8_t>(md, len));
}

error fail(std::string msg) {
    return error(errc::bad_migration, std::move(msg));
}

}  // namespace

result<migration> make_migration(std::string_view filename, std::string sql) {
    // NNNN_name.sql
    if (filename.size() < 10 || filename.substr(filename.size() - 4) != ".sql" || filename[4] != '_')
        return fail(std::string(filename) + ": expected NNNN_name.sql");
    auto v = parse_int64(filename.substr(0, 4));
    if (!v || *v <= 0) return fail(std::string(filename) + ": expected a 4-digit version > 0");
    migration m;
    m.version = static_cast<int>(*v);
    m.name = std::string(filename.substr(0, filename.size() - 4));
    m.compatible_down_to = m.version;
    constexpr std::string_view decl = "-- chargeguard: compatible-down-to ";
    if (auto at = sql.find(decl); at != std::string::npos) {
        auto end = sql.find_first_of("\r\n", at);
        auto value = std::string_view(sql).substr(
            at + decl.size(), end == std::string::npos ? std::string::npos : end - at - decl.size());
        auto down = parse_int64(value);
        if (!down || *down <= 0 || *down > m.version)
            return fail(std::string(filename) + ": compatible-down-to must be a version from 1 to " +
                        std::to_string(m.version));
        m.compatible_down_to = static_cast<int>(*down);
    }
    m.checksum = sha256_hex(sql);
    m.sql = std::move(sql);
    return m;
}

result<void> check_sequence(const std::vector<migration>& ms) {
    for (std::size_t i = 1; i < ms.size(); ++i)
        if (ms[i].version <= ms[i - 1].version)
            return fail(ms[i].name + " does not come after " + ms[i - 1].name + " (versions must increase)");
    return {};
}

result<std::vector<migration>> embedded_migrations() {
    std::vector<migration> out;
    for (const auto& f : embedded_migration_files()) {
        auto m = make_migration(f.filename, f.sql);
        if (!m) return m.err();
        out.push_back(std::move(*m));
    }
    std::sort(out.begin(), out.end(),
              [](const migration& a, const migration& b) { return a.version < b.version; });
    if (auto ok = check_sequence(out); !ok) return ok.err();
    return out;
}

result<std::vector<migration>> load_migrations(const std::string& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<migration> out;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        auto name = it->path().filename().string();
        if (it->path().extension() != ".sql") continue;
        std::ifstream in(it->path(), std::ios::binary);
        std::ostringstream text;
        text << in.rdbuf();
        if (!in) return fail("cannot read " + it->path().string());
        auto m = make_migration(name, text.str());
        if (!m) return m.err();
        out.push_back(std::move(*m));
    }
    if (ec) return fail("cannot list " + dir + ": " + ec.message());
    std::sort(out.begin(), out.end(),
              [](const migration& a, const migration& b) { return a.version < b.version; });
    if (auto ok = check_sequence(out); !ok) return ok.err();
    return out;
}

namespace {

error wrap(const error& e, const std::string& what) {
    return error(e.code, what + ": " + e.message);
}

// Everything migrate() does while holding the advisory lock.
net::awaitable<result<migrate_report>> migrate_locked(connection& c, const std::vector<migration>& ms,
                                                      const migrate_options& opts, const logger& log) {
    migrate_report rep;
    auto exists = co_await c.query("SELECT to_regclass('schema_migrations') IS NOT NULL");
    if (!exists) co_return wrap(exists.err(), "checking schema_migrations");
    bool have_table = exists->get<bool>(0, 0);
    if (!have_table && !opts.dry_run) {
        auto r = co_await c.execute(
            "CREATE TABLE schema_migrations ("
            " version    integer     PRIMARY KEY,"
            " name       text        NOT NULL,"
            " checksum   text        NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())");
        if (!r) co_return wrap(r.err(), "creating schema_migrations");
        have_table = true;
    }
    if (have_table && !opts.dry_run) {
        // Added after the table's first release; NULL for rows written before (read as "no older binary").
        auto r = co_await c.execute(
            "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS compatible_down_to integer");
        if (!r) co_return wrap(r.err(), "adding schema_migrations.compatible_down_to");
    }
    std::vector<std::pair<int, std::string>> applied;  // version, checksum
    if (have_table) {
        auto rows = co_await c.query("SELECT version, checksum FROM schema_migrations ORDER BY version");
        if (!rows) co_return wrap(rows.err(), "reading schema_migrations");
        for (std::size_t i = 0; i < rows->size(); ++i)
            applied.emplace_back((*rows)[i].get<std::int32_t>(0), (*rows)[i].get<std::string>(1));
    }
    std::set<int> known;
    for (const auto& m : ms) known.insert(m.version);
    for (const auto& [v, sum] : applied)
        if (!known.count(v)) rep.unknown_versions.push_back(v);

    for (const auto& m : ms) {
        auto it = std::find_if(applied.begin(), applied.end(), [&](auto& a) { return a.first == m.version; });
        if (it != applied.end()) {
            if (it->second != m.checksum)
                co_return fail(m.name + " was changed after it was applied (checksum " + it->second +
                               " in the database, " + m.checksum +
                               " now); migrations are forward-only: add a new one");
            ++rep.already_applied;
            continue;
        }
        if (opts.dry_run) {
            rep.applied.push_back(m.name);
            continue;
        }
        // One transaction per migration: the schema change and its record land together or not at all.
        auto begin = co_await c.execute("BEGIN");
        if (!begin) co_return wrap(begin.err(), m.name);
        auto body = co_await c.execute(m.sql, opts.statement_timeout);
        result<rows> record = error(errc::protocol_error, "not run");
        if (body)
            record = co_await c.query(
                "INSERT INTO schema_migrations (version, name, checksum, compatible_down_to) "
                "VALUES ($1, $2, $3, $4)",
                m.version, m.name, m.checksum, m.compatible_down_to);
        // (No co_await inside ?: — g++ 12 miscompiles it.)
        result<void> done;
        if (body && record)
            done = co_await c.execute("COMMIT");
        else
            done = co_await c.execute("ROLLBACK");
        if (!body) co_return wrap(body.err(), m.name);
        if (!record) co_return wrap(record.err(), m.name + " (recording it)");
        if (!done) co_return wrap(done.err(), m.name + " (commit)");
        log.info("migration applied", {{"migration", m.name}});
        rep.applied.push_back(m.name);
    }
    co_return rep;
}

}  // namespace

net::awaitable<result<migrate_report>> migrate(connection& c, const std::vector<migration>& ms,
                                               migrate_options opts, logger log) {
    if (auto ok = check_sequence(ms); !ok) co_return ok.err();
    // Session-level lock: a second instance waits here (server-side; our loop stays free) until the first
    // commits and unlocks, then finds everything applied.
    auto lock =
        co_await c.query_with("SELECT pg_advisory_lock($1)", params(migration_lock_key), opts.lock_timeout);
    if (!lock) {
        if (lock.code() == errc::timeout)
            co_return error(errc::timeout,
                            "another chargeguard migrate run held the migration lock for more than " +
                                std::to_string(opts.lock_timeout.count()) + " ms");
        co_return wrap(lock.err(), "taking the migration lock");
    }
    auto rep = co_await migrate_locked(c, ms, opts, log);
    if (!c.broken()) {
        auto unlock = co_await c.query("SELECT pg_advisory_unlock($1)", migration_lock_key);
        if (!unlock && rep) co_return wrap(unlock.err(), "releasing the migration lock");
    }
    co_return rep;
}

schema_status::verdict schema_status::judge() const {
    if (!missing.empty()) return verdict::older;
    if (newer.empty()) return verdict::current;
    return newer_needs_at_least <= required ? verdict::newer_compatible : verdict::newer_incompatible;
}

std::string schema_status::describe() const {
    auto v4 = [](int v) {
        char b[16];
        std::snprintf(b, sizeof b, "%04d", v);
        return std::string(b);
    };
    auto list = [&](const std::vector<int>& vs) {
        std::string out;
        for (int v : vs) out += (out.empty() ? "" : ",") + v4(v);
        return out;
    };
    std::string out = "database schema " + v4(current) + ", this binary needs " + v4(required);
    switch (judge()) {
        case verdict::current:
            return out + ": current";
        case verdict::older:
            return out + ": missing " + list(missing) + " (run chargeguard migrate, or --migrate)";
        case verdict::newer_compatible:
            return out + ": newer migrations " + list(newer) + " declare binaries from " +
                   v4(newer_needs_at_least) + " compatible";
        case verdict::newer_incompatible:
            return out + ": newer migrations " + list(newer) + " need binaries from " +
                   v4(newer_needs_at_least) + " (roll forward, or restore the schema)";
    }
    return out;
}

net::awaitable<result<schema_status>> read_schema_status(connection& c, const std::vector<migration>& ms) {
    schema_status st;
    std::set<int> known;
    for (const auto& m : ms) {
        known.insert(m.version);
        st.required = std::max(st.required, m.version);
    }
    auto exists = co_await c.query(
        "SELECT to_regclass('schema_migrations') IS NOT NULL, "
        "EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('schema_migrations') "
        "AND attname = 'compatible_down_to' AND NOT attisdropped)");
    if (!exists) co_return wrap(exists.err(), "checking schema_migrations");
    std::set<int> applied;
    if (exists->get<bool>(0, 0)) {
        const char* sql = exists->get<bool>(0, 1)
                              ? "SELECT version, coalesce(compatible_down_to, version) "
                                "FROM schema_migrations ORDER BY version"
                              : "SELECT version, version FROM schema_migrations ORDER BY version";
        auto rows = co_await c.query(sql);
        if (!rows) co_return wrap(rows.err(), "reading schema_migrations");
        for (std::size_t i = 0; i < rows->size(); ++i) {
            int v = (*rows)[i].get<std::int32_t>(0);
            applied.insert(v);
            st.current = std::max(st.current, v);
            if (!known.count(v)) {
                st.newer.push_back(v);
                st.newer_needs_at_least = std::max(st.newer_needs_at_least, (*rows)[i].get<std::int32_t>(1));
            }
        }
    }
    for (int v : known)
        if (!applied.count(v)) st.missing.push_back(v);
    co_return st;
}

}  // namespace cg::pg
