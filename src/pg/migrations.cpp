#include "pg/migrations.hpp"

#include <openssl/evp.h>

#include <algorithm>
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
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.version,
                m.name, m.checksum);
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

}  // namespace cg::pg
