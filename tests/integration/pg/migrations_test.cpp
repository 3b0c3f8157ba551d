// Migrations against the real server: the schema they create, idempotence, dry runs, checksums, failure
// atomicity, and concurrent runs (in-process and as two `chargeguard migrate` processes).
#include "pg/migrations.hpp"

#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <thread>

#include "helpers.hpp"
#include "net/timeout.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;

namespace {

BOOST_AUTO_TEST_SUITE(migrations)

const std::vector<pg::migration>& all() {
    static const auto ms = must(pg::embedded_migrations(), "embedded");
    return ms;
}

BOOST_AUTO_TEST_CASE(embedded_files_are_ordered) {
    BOOST_TEST_REQUIRE(all().size() >= 3u);
    // Strictly increasing from 1 (numbers are reserved per change, so a branch may carry a gap until merged).
    BOOST_TEST(all()[0].version == 1);
    for (std::size_t i = 1; i < all().size(); ++i) BOOST_TEST(all()[i].version > all()[i - 1].version);
}

net::awaitable<std::unique_ptr<pg::connection>> connect_db(pg_fixture& f, const std::string& db) {
    co_return must(
        co_await pg::connection::connect(cg::test::server_config("dbname=" + db), f.offload.get_executor()),
        "connect");
}

std::string key(int i) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%032x", i);
    return buf;
}

net::awaitable<void> twice_is_noop(pg_fixture& f, std::string db) {
    auto c = co_await connect_db(f, db);
    auto first = must(co_await pg::migrate(*c, all(), {}, logger()), "first");
    BOOST_TEST(first.applied.size() == all().size());
    BOOST_TEST(first.already_applied == 0u);
    auto second = must(co_await pg::migrate(*c, all(), {}, logger()), "second");
    BOOST_TEST(second.applied.empty());
    BOOST_TEST(second.already_applied == all().size());
    auto rows =
        must(co_await c->query("SELECT version, name FROM schema_migrations ORDER BY version"), "history");
    BOOST_TEST_REQUIRE(rows.size() == all().size());
    BOOST_TEST(rows[0].get<std::string>(1) == "0001_billing_records");

    // Every §5 table exists.
    for (const char* t : {"billing_records", "dead_letters", "vault_keys", "vault_spend", "vault_audit"}) {
        auto r = must(co_await c->query("SELECT to_regclass($1) IS NOT NULL", t), "regclass");
        BOOST_TEST(r[0].get<bool>(0), t);
    }
    // The billing pre-flight statement and the ledger's constraints.
    const char* preflight =
        "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
        "stripe_customer_id, "
        "lease_until) VALUES ($1, $2, $3, $4, $5, $6, now() + interval '30 seconds') "
        "ON CONFLICT DO NOTHING RETURNING key";
    BOOST_TEST(must(co_await c->query(preflight, key(1), "cus_1", "2024-05", 1999, "usd", "cus_S1"), "insert")
                   .size() == 1u);
    BOOST_TEST(
        must(co_await c->query(preflight, key(1), "cus_1", "2024-05", 1999, "usd", "cus_S1"), "dup").size() ==
        0u);
    // Same customer and period under another key: ON CONFLICT DO NOTHING covers the UNIQUE too.
    BOOST_TEST(must(co_await c->query(preflight, key(2), "cus_1", "2024-05", 1999, "usd", "cus_S1"), "same")
                   .size() == 0u);
    auto plain =
        "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
        "stripe_customer_id) VALUES ($1, $2, $3, $4, $5, $6)";
    BOOST_TEST((co_await c->query(plain, key(3), "cus_1", "2024-05", 5, "usd", "cus_S1")).code() ==
               pg::errc::unique_violation);
    BOOST_TEST((co_await c->query(plain, key(4), "cus_2", "2024-05", 0, "usd", "cus_S1")).code() ==
               pg::errc::check_violation);
    BOOST_TEST((co_await c->query(plain, "not-hex", "cus_2", "2024-05", 5, "usd", "cus_S1")).code() ==
               pg::errc::check_violation);
    BOOST_TEST(
        (co_await c->query("UPDATE billing_records SET status = 'bogus' WHERE key = $1", key(1))).code() ==
        pg::errc::check_violation);
    BOOST_TEST(
        (co_await c->query("UPDATE billing_records SET status = 'charged' WHERE key = $1", key(1))).code() ==
        pg::errc::check_violation);  // charged needs a charge_id
    auto upd = must(
        co_await c->query("UPDATE billing_records SET status = 'charged', charge_id = 'ch_1' WHERE key = $1 "
                          "RETURNING updated_at > created_at",
                          key(1)),
        "charge");
    BOOST_TEST(upd.affected() == 1);
    // The vault's reservation key: one row per (key, idempotency key).
    must(co_await c->query(
             "INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency) "
             "VALUES ('vk_1', 'test', $1, '2024-05', 10000, 'usd')",
             bytes(32, 7)),
         "vault key");
    const char* reserve =
        "INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING RETURNING amount_cents";
    BOOST_TEST(must(co_await c->query(reserve, "vk_1", "idem-1", 500), "reserve").size() == 1u);
    BOOST_TEST(must(co_await c->query(reserve, "vk_1", "idem-1", 500), "retry").size() == 0u);
    BOOST_TEST((co_await c->query(reserve, "vk_missing", "idem-1", 500)).code() ==
               pg::errc::foreign_key_violation);
    // The indexes the queries need exist.
    auto idx = must(
        co_await c->query("SELECT count(*) FROM pg_indexes WHERE indexname = ANY($1::text[])",
                          "{billing_records_pending_lease_idx,dead_letters_received_at_idx,"
                          "vault_spend_unresolved_idx,vault_keys_secret_hash_key,vault_audit_key_at_idx}"),
        "indexes");
    BOOST_TEST(idx[0].get<std::int64_t>(0) == 5);
}

BOOST_AUTO_TEST_CASE(applied_twice_is_a_noop_and_the_schema_holds) {
    pg_fixture f;
    cg::test::scratch_db db("mig");
    cg::test::run_async(f.io, [&] { return twice_is_noop(f, db.name); });
}

net::awaitable<void> dry_run(pg_fixture& f, std::string db) {
    auto c = co_await connect_db(f, db);
    pg::migrate_options o;
    o.dry_run = true;
    auto rep = must(co_await pg::migrate(*c, all(), o, logger()), "dry run");
    BOOST_TEST(rep.applied.size() == all().size());
    auto t =
        must(co_await c->query(
                 "SELECT to_regclass('schema_migrations') IS NULL, to_regclass('billing_records') IS NULL"),
             "check");
    BOOST_TEST(t[0].get<bool>(0));
    BOOST_TEST(t[0].get<bool>(1));
}

BOOST_AUTO_TEST_CASE(dry_run_changes_nothing) {
    pg_fixture f;
    cg::test::scratch_db db("mig");
    cg::test::run_async(f.io, [&] { return dry_run(f, db.name); });
}

net::awaitable<void> changed_and_failing(pg_fixture& f, std::string db) {
    auto c = co_await connect_db(f, db);
    must(co_await pg::migrate(*c, all(), {}, logger()), "apply");
    // An applied migration edited afterwards is refused.
    auto edited = all();
    edited[1] = must(pg::make_migration("0002_dead_letters.sql", edited[1].sql + "\n-- edited\n"), "edit");
    auto r = co_await pg::migrate(*c, edited, {}, logger());
    BOOST_TEST(r.code() == pg::errc::bad_migration);
    BOOST_TEST(r.err().message.find("0002_dead_letters was changed") != std::string::npos, r.err().message);
    // A failing migration leaves nothing behind: not its first statement, not its record.
    auto broken = all();
    broken.push_back(
        must(pg::make_migration("0099_broken.sql", "CREATE TABLE half_done (id int); SELECT 1/0;"), "make"));
    auto b = co_await pg::migrate(*c, broken, {}, logger());
    BOOST_TEST(b.code() == pg::errc::data_exception);
    BOOST_TEST(b.err().message.find("0099_broken") != std::string::npos, b.err().message);
    auto t = must(co_await c->query("SELECT to_regclass('half_done') IS NULL, "
                                    "(SELECT count(*) FROM schema_migrations WHERE version = 99)"),
                  "check");
    BOOST_TEST(t[0].get<bool>(0));
    BOOST_TEST(t[0].get<std::int64_t>(1) == 0);
    // And the lock was released: another session can take it at once.
    auto other = co_await connect_db(f, db);
    auto lock =
        must(co_await other->query("SELECT pg_try_advisory_lock($1)", pg::migration_lock_key), "try lock");
    BOOST_TEST(lock[0].get<bool>(0));
}

BOOST_AUTO_TEST_CASE(changed_or_failing_migrations_are_refused_atomically) {
    pg_fixture f;
    cg::test::scratch_db db("mig");
    cg::test::run_async(f.io, [&] { return changed_and_failing(f, db.name); });
}

net::awaitable<void> migrate_on(pg::connection& c, pg::migrate_report& out) {
    out = must(co_await pg::migrate(c, all(), {}, logger()), "concurrent migrate");
}

net::awaitable<void> concurrent(pg_fixture& f, std::string db) {
    auto a = co_await connect_db(f, db);
    auto b = co_await connect_db(f, db);
    // Both start at once; the advisory lock makes the second wait and then find everything applied.
    pg::migrate_report ra, rb;
    co_await net::all_of(migrate_on(*a, ra), migrate_on(*b, rb));
    BOOST_TEST(ra.applied.size() + rb.applied.size() == all().size());
    BOOST_TEST((ra.applied.empty() || rb.applied.empty()));
    auto n = must(co_await a->query("SELECT count(*) FROM schema_migrations"), "count");
    BOOST_TEST(n[0].get<std::int64_t>(0) == static_cast<std::int64_t>(all().size()));
}

BOOST_AUTO_TEST_CASE(two_concurrent_runs_apply_each_migration_once) {
    pg_fixture f;
    cg::test::scratch_db db("mig");
    cg::test::run_async(f.io, [&] { return concurrent(f, db.name); });
}

// Runs `cmd` through the shell, returning its exit status and stdout.
std::pair<int, std::string> shell(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return {-1, {}};
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    int st = ::pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

BOOST_AUTO_TEST_CASE(two_concurrent_migrate_processes) {
    const char* bin = std::getenv("CHARGEGUARD_BIN");
    BOOST_TEST_REQUIRE(bin, "CHARGEGUARD_BIN (set by meson) names the chargeguard executable");
    cg::test::scratch_db db("cli");
    std::string cmd = std::string(bin) + " --log-level=off migrate --pg-dsn 'dbname=" + db.name + "'";
    std::pair<int, std::string> r1, r2;
    std::thread t1([&] { r1 = shell(cmd); });
    std::thread t2([&] { r2 = shell(cmd); });
    t1.join();
    t2.join();
    BOOST_TEST(r1.first == 0, r1.second);
    BOOST_TEST(r2.first == 0, r2.second);
    auto n = all().size();
    auto applied = [](const std::string& out) {
        std::size_t a = 0, b = 0;
        std::sscanf(out.substr(out.rfind('\n', out.size() - 2) + 1).c_str(),
                    "%zu applied, %zu already applied", &a, &b);
        return std::pair(a, b);
    };
    auto [a1, b1] = applied(r1.second);
    auto [a2, b2] = applied(r2.second);
    BOOST_TEST(a1 + a2 == n, r1.second << r2.second);
    BOOST_TEST(b1 + b2 == n, r1.second << r2.second);
    auto again = shell(cmd + " --dry-run");
    BOOST_TEST(again.first == 0);
    BOOST_TEST(again.second.find("0 pending, " + std::to_string(n) + " already applied") != std::string::npos,
               again.second);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
