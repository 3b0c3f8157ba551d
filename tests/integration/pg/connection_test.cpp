// One connection against the real server: typed round trips, ON CONFLICT, pipelines, errors, timeouts.
#include <boost/test/unit_test.hpp>
#include <limits>

#include "helpers.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::pg_fixture;

namespace {

BOOST_AUTO_TEST_SUITE(connection)

net::awaitable<std::unique_ptr<pg::connection>> connect_ok(pg_fixture& f,
                                                           pg::config cfg = cg::test::server_config(),
                                                           pg::connection_options opts = {}) {
    auto c = co_await pg::connection::connect(cfg, f.offload.get_executor(), opts);
    if (!c) throw std::runtime_error("connect: " + c.err().describe());
    co_return std::move(*c);
}

using cg::test::must;

pg::timestamp ts(int y, unsigned mo, unsigned d, int h, int mi, int s, int us) {
    using namespace std::chrono;
    return sys_days(year{y} / month{mo} / day{d}) + hours(h) + minutes(mi) + seconds(s) + microseconds(us);
}

net::awaitable<void> round_trip(pg_fixture& f) {
    auto c = co_await connect_ok(f);
    must(co_await c->execute("CREATE TEMP TABLE t (n int, i int8, s text, b bool, ts timestamptz, by bytea)"),
         "create");
    const std::int64_t ints[] = {0, -1, 42, std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max()};
    const std::string texts[] = {"", "plain", "héllo ✓ 日本", "quote ' and backslash \\ and \"dq\"",
                                 "tab\tnewline\n"};
    const pg::timestamp times[] = {ts(1970, 1, 1, 0, 0, 0, 0), ts(2000, 2, 29, 12, 0, 0, 1),
                                   ts(1999, 12, 31, 23, 59, 59, 999999), ts(1, 1, 1, 0, 0, 0, 0),
                                   ts(9999, 12, 31, 23, 59, 59, 999999)};
    bytes all(256);
    for (int i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(i);
    const bytes blobs[] = {all, {}, {0}, {0x5c, 0x78}, {0xff, 0x00, 0xff}};
    for (int n = 0; n < 5; ++n) {
        auto r = must(co_await c->query("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6)", n, ints[n], texts[n],
                                        n % 2 == 0, times[n], blobs[n]),
                      "insert");
        BOOST_TEST(r.affected() == 1);
    }
    // A row of NULLs through std::optional and pg::null.
    must(co_await c->query("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6)", 5, std::optional<std::int64_t>(),
                           pg::null, std::optional<bool>(), std::optional<pg::timestamp>(),
                           std::optional<bytes>()),
         "insert nulls");

    auto r = must(co_await c->query("SELECT n, i, s, b, ts, by FROM t ORDER BY n"), "select");
    BOOST_TEST_REQUIRE(r.size() == 6u);
    for (std::size_t n = 0; n < 5; ++n) {
        BOOST_TEST(r[n].get<std::int32_t>(0) == static_cast<std::int32_t>(n));
        BOOST_TEST(r[n].get<std::int64_t>(1) == ints[n]);
        BOOST_TEST(r[n].get<std::string>(2) == texts[n]);
        BOOST_TEST(r[n].get<bool>(3) == (n % 2 == 0));
        BOOST_TEST((r[n].get<pg::timestamp>(4) == times[n]), "timestamp " << n);
        BOOST_TEST((r[n].get<bytes>(5) == blobs[n]), "bytea " << n);
    }
    BOOST_TEST(!r[5].get<std::optional<std::int64_t>>(1).has_value());
    BOOST_TEST(!r[5].get<std::optional<std::string>>(2).has_value());
    BOOST_TEST(!r[5].get<std::optional<bool>>(3).has_value());
    BOOST_TEST(!r[5].get<std::optional<pg::timestamp>>(4).has_value());
    BOOST_TEST(!r[5].get<std::optional<bytes>>(5).has_value());
    BOOST_CHECK_THROW(r[5].get<std::int64_t>(1), pg::column_error);  // NULL into a non-optional
    BOOST_CHECK_THROW(r[0].get<bool>(1), pg::column_error);          // int8 read as bool

    // The server sees the values we meant (not just a codec that round-trips its own mistakes).
    auto chk = must(
        co_await c->query("SELECT i = -9223372036854775808, length(s), ts = '2000-02-29 12:00:00.000001+00', "
                          "octet_length(by) "
                          "FROM t WHERE n = $1 OR n = $2 ORDER BY n",
                          3, 1),
        "check");
    BOOST_TEST(chk[0].get<bool>(2) == true);       // n = 1: the leap-day timestamp
    BOOST_TEST(chk[0].get<std::int64_t>(3) == 0);  // n = 1: empty bytea
    BOOST_TEST(chk[1].get<bool>(0) == true);       // n = 3: INT64_MIN
    BOOST_TEST(chk[1].get<std::int64_t>(1) == 32);
    auto utf8 = must(co_await c->query("SELECT length(s), octet_length(s) FROM t WHERE n = 2"), "utf8");
    BOOST_TEST(utf8[0].get<std::int64_t>(0) == 10);  // characters: the text arrived as UTF-8
    BOOST_TEST(utf8[0].get<std::int64_t>(1) == static_cast<std::int64_t>(texts[2].size()));
    auto blob =
        must(co_await c->query("SELECT octet_length(by), get_byte(by, 255), by = $1 FROM t WHERE n = 0", all),
             "blob");
    BOOST_TEST(blob[0].get<std::int64_t>(0) == 256);
    BOOST_TEST(blob[0].get<std::int64_t>(1) == 255);
    BOOST_TEST(blob[0].get<bool>(2) == true);
    auto tsq =
        must(co_await c->query("SELECT $1::timestamptz = '1999-12-31 23:59:59.999999+00'", times[2]), "ts");
    BOOST_TEST(tsq[0].get<bool>(0) == true);
}

BOOST_AUTO_TEST_CASE(typed_round_trips) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return round_trip(f); });
}

net::awaitable<void> on_conflict(pg_fixture& f) {
    auto c = co_await connect_ok(f);
    must(co_await c->execute(
             "CREATE TEMP TABLE k (key text PRIMARY KEY, amount bigint NOT NULL CHECK (amount > 0))"),
         "create");
    const char* sql = "INSERT INTO k (key, amount) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING key";
    auto first = must(co_await c->query(sql, "a", 100), "first");
    BOOST_TEST(first.size() == 1u);
    BOOST_TEST(first[0].get<std::string>(0) == "a");
    auto again = must(co_await c->query(sql, "a", 999), "again");
    BOOST_TEST(again.size() == 0u);  // conflict: nothing inserted, nothing returned
    BOOST_TEST(again.affected() == 0);
    auto other = must(co_await c->query(sql, "b", 5), "other");
    BOOST_TEST(other.size() == 1u);
    auto amount = must(co_await c->query("SELECT amount FROM k WHERE key = $1", "a"), "amount");
    BOOST_TEST(amount[0].get<std::int64_t>(0) == 100);  // the conflicting insert changed nothing
    // A constraint violation is an error with its category, and the connection stays usable.
    auto bad = co_await c->query(sql, "c", 0);
    BOOST_TEST(bad.code() == pg::errc::check_violation);
    BOOST_TEST(bad.err().message.find("23514") != std::string::npos);
    auto dup = co_await c->query("INSERT INTO k VALUES ($1, $2)", "a", 1);
    BOOST_TEST(dup.code() == pg::errc::unique_violation);
    auto syntax = co_await c->query("SELEC 1");
    BOOST_TEST(syntax.code() == pg::errc::syntax_error);
    BOOST_TEST(!c->broken());
    auto ok = must(co_await c->query("SELECT count(*) FROM k"), "count");
    BOOST_TEST(ok[0].get<std::int64_t>(0) == 2);
}

BOOST_AUTO_TEST_CASE(insert_on_conflict_do_nothing_returning) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return on_conflict(f); });
}

net::awaitable<void> pipeline_one_failure(pg_fixture& f) {
    auto c = co_await connect_ok(f);
    must(co_await c->execute("CREATE TEMP TABLE p (id int PRIMARY KEY)"), "create");
    pg::pipeline batch;
    for (int i = 0; i < 1000; ++i)
        batch.add("INSERT INTO p (id) VALUES ($1) RETURNING id", i == 500 ? 7 : i);  // 500 repeats id 7
    auto r = must(co_await c->run(batch), "run");
    BOOST_TEST_REQUIRE(r.size() == 1000u);
    int failed = 0;
    for (int i = 0; i < 1000; ++i) {
        if (i < 500) BOOST_TEST(r[i].code() == pg::errc::rolled_back, "statement " << i);
        if (i > 500) BOOST_TEST(r[i].code() == pg::errc::pipeline_aborted, "statement " << i);
        if (r[i].code() == pg::errc::unique_violation) ++failed;
    }
    BOOST_TEST(failed == 1);
    BOOST_TEST(r[500].code() == pg::errc::unique_violation);
    // The batch was one implicit transaction: nothing of it is left, and the connection is reusable.
    auto count = must(co_await c->query("SELECT count(*) FROM p"), "count");
    BOOST_TEST(count[0].get<std::int64_t>(0) == 0);
    BOOST_TEST((c->transaction_status() == pg::tx_status::idle));

    // The same batch with a sync per statement: only statement 500 fails, the others commit.
    pg::pipeline each(pg::pipeline::sync_mode::per_statement);
    for (int i = 0; i < 1000; ++i) each.add("INSERT INTO p (id) VALUES ($1) RETURNING id", i == 500 ? 7 : i);
    auto e = must(co_await c->run(each), "run each");
    int ok = 0, bad = 0;
    for (int i = 0; i < 1000; ++i) {
        if (e[i]) {
            ++ok;
            BOOST_TEST(e[i]->get<std::int64_t>(0, 0) == i);
        } else {
            ++bad;
            BOOST_TEST(i == 500);
            BOOST_TEST(e[i].code() == pg::errc::unique_violation);
        }
    }
    BOOST_TEST(ok == 999);
    BOOST_TEST(bad == 1);
    auto count2 = must(co_await c->query("SELECT count(*) FROM p"), "count");
    BOOST_TEST(count2[0].get<std::int64_t>(0) == 999);

    // A clean batch returns every statement's rows in order.
    pg::pipeline sel;
    for (int i = 0; i < 100; ++i) sel.add("SELECT $1::int8 * 2", i);
    auto s = must(co_await c->run(sel), "select batch");
    for (int i = 0; i < 100; ++i) BOOST_TEST(s[i]->get<std::int64_t>(0, 0) == 2 * i);
}

BOOST_AUTO_TEST_CASE(pipeline_of_1000_with_one_failure) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return pipeline_one_failure(f); });
}

net::awaitable<void> prepared_statements(pg_fixture& f) {
    auto c = co_await connect_ok(f);
    // The same text with different parameter types is two statements (an int4 plan must not get an int8).
    BOOST_TEST(must(co_await c->query("SELECT $1 + 0", 5), "int4")[0].get<std::int64_t>(0) == 5);
    BOOST_TEST(must(co_await c->query("SELECT $1 + 0", std::int64_t{1} << 40), "int8")[0].get<std::int64_t>(
                   0) == (std::int64_t{1} << 40));
    BOOST_TEST(must(co_await c->query("SELECT $1 + 0", 6), "int4 again")[0].get<std::int64_t>(0) == 6);
    auto n = must(
        co_await c->query("SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT $1 + 0'"),
        "n");
    BOOST_TEST(n[0].get<std::int64_t>(0) == 2);  // parsed once per type signature, then reused
    // A statement that does not parse fails on its own, on a single query and inside pipelines.
    BOOST_TEST((co_await c->query("SELEC $1", 1)).code() == pg::errc::syntax_error);
    pg::pipeline each(pg::pipeline::sync_mode::per_statement);
    for (int i = 0; i < 10; ++i) each.add(i == 4 ? "SELEC $1::int8" : "SELECT $1::int8", i);
    auto r = must(co_await c->run(each), "per statement");
    for (int i = 0; i < 10; ++i) {
        if (i == 4)
            BOOST_TEST(r[i].code() == pg::errc::syntax_error);
        else
            BOOST_TEST(r[i]->get<std::int64_t>(0, 0) == i);
    }
    pg::pipeline batch;
    for (int i = 0; i < 10; ++i) batch.add(i == 4 ? "SELEC $1::int4" : "SELECT $1::int4", i);
    auto b = must(co_await c->run(batch), "per batch");
    for (int i = 0; i < 10; ++i) {
        auto want = i < 4    ? pg::errc::rolled_back
                    : i == 4 ? pg::errc::syntax_error
                             : pg::errc::pipeline_aborted;
        BOOST_TEST(b[i].code() == want, "statement " << i << ": " << b[i].code().message());
    }
    // Statements whose Parse was skipped are parsed again next time, and work.
    auto again = must(co_await c->run(each), "again");
    BOOST_TEST(again[9]->get<std::int64_t>(0, 0) == 9);
    auto ok = must(co_await c->query("SELECT $1::int4", 3), "parsed after skip");
    BOOST_TEST(ok[0].get<std::int32_t>(0) == 3);
}

BOOST_AUTO_TEST_CASE(statements_prepared_once_per_connection) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return prepared_statements(f); });
}

net::awaitable<void> timeout_cancels(pg_fixture& f) {
    pg::connection_options opts;
    opts.query_timeout = 200ms;
    auto c = co_await connect_ok(f, cg::test::server_config(), opts);
    auto pid = c->backend_pid();
    auto t0 = std::chrono::steady_clock::now();
    auto r = co_await c->query("SELECT pg_sleep(30)");
    auto took = std::chrono::steady_clock::now() - t0;
    BOOST_TEST(r.code() == pg::errc::timeout);
    BOOST_TEST(took >= 200ms);
    BOOST_TEST(took < 2s);
    // The server ended the query (our PQcancel): its backend is no longer running pg_sleep.
    auto admin = co_await connect_ok(f);
    auto st = must(co_await admin->query("SELECT state FROM pg_stat_activity WHERE pid = $1", pid), "state");
    BOOST_REQUIRE(st.size() == 1u);
    BOOST_TEST(st[0].get<std::string>(0) != "active");
    // Yet the connection is not reused: the postmaster signals a cancel twice (backend and process group),
    // and the second signal can cancel whatever this connection runs next.
    BOOST_TEST(c->broken());
    auto after = co_await c->query("SELECT 1");
    BOOST_TEST(after.code() == pg::errc::connection_lost);
}

BOOST_AUTO_TEST_CASE(query_timeout_cancels_server_side) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return timeout_cancels(f); });
}

net::awaitable<void> refused(pg_fixture& f) {
    auto port = cg::test::closed_port();
    auto cfg = cg::test::loopback_config(port);
    auto r = co_await pg::connection::connect(cfg, f.offload.get_executor());
    BOOST_TEST(r.code() == pg::errc::connection_failed);
    BOOST_TEST(r.err().message.find("Connection refused") != std::string::npos, r.err().message);
    BOOST_TEST(r.err().message.find(std::to_string(port)) != std::string::npos, r.err().message);
}

BOOST_AUTO_TEST_CASE(connection_refused_is_clear) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return refused(f); });
}

net::awaitable<void> bad_password(pg_fixture& f) {
    auto wrong = cg::test::server_config("user=cg_password password=wrong-horse");
    auto r = co_await pg::connection::connect(wrong, f.offload.get_executor());
    BOOST_TEST(r.code() == pg::errc::auth_failed);
    BOOST_TEST(
        r.err().message.find("password authentication failed for user \"cg_password\"") != std::string::npos,
        r.err().message);
    auto none = cg::test::server_config("user=cg_password password=");
    auto r2 = co_await pg::connection::connect(none, f.offload.get_executor());
    BOOST_TEST(r2.code() == pg::errc::auth_failed, r2.err().describe());
    // The right password works: the failures above are about the credentials, not the setup.
    auto right = cg::test::server_config("user=cg_password password=correct-horse");
    auto c = co_await connect_ok(f, right);
    auto who = must(co_await c->query("SELECT current_user"), "who");
    BOOST_TEST(who[0].get<std::string>(0) == "cg_password");
}

BOOST_AUTO_TEST_CASE(bad_credentials_are_clear) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return bad_password(f); });
}

net::awaitable<void> resolves_names(pg_fixture& f) {
    // "localhost" goes through Asio's resolver; libpq only ever sees hostaddr.
    auto cfg = cg::test::server_config("host=localhost");
    auto c = co_await connect_ok(f, cfg);
    auto r = must(co_await c->query("SELECT inet_server_addr()::text"), "addr");
    auto addr = r[0].get<std::string>(0);
    BOOST_TEST((addr.rfind("127.0.0.1", 0) == 0 || addr.rfind("::1", 0) == 0), addr);
    auto bad = co_await pg::connection::connect(cg::test::server_config("host=no-such-host.invalid"),
                                                f.offload.get_executor());
    BOOST_TEST(bad.code() == pg::errc::connection_failed);
    BOOST_TEST(bad.err().message.find("no-such-host.invalid") != std::string::npos, bad.err().message);
}

BOOST_AUTO_TEST_CASE(host_names_resolved_by_asio) {
    pg_fixture f;
    cg::test::run_async(f.io, [&] { return resolves_names(f); });
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
