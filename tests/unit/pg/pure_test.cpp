// Pure parts of the pg module: SQLSTATE mapping, text codecs, parameter encoding, DSN parsing, backoff,
// migration names. No server, no io_context.
#include <boost/test/unit_test.hpp>
#include <cstdlib>

#include "pg/config.hpp"
#include "pg/error.hpp"
#include "pg/migrations.hpp"
#include "pg/params.hpp"
#include "pg/pool.hpp"
#include "pg/types.hpp"

using namespace cg;
using namespace std::chrono;

BOOST_AUTO_TEST_CASE(sqlstate_categories) {
    struct {
        const char* state;
        pg::errc want;
    } table[] = {
        {"23505", pg::errc::unique_violation},
        {"23503", pg::errc::foreign_key_violation},
        {"23514", pg::errc::check_violation},
        {"23502", pg::errc::not_null_violation},
        {"23P01", pg::errc::integrity_violation},
        {"40001", pg::errc::serialization_failure},
        {"40P01", pg::errc::deadlock},
        {"55P03", pg::errc::lock_not_available},
        {"57014", pg::errc::query_canceled},
        {"57P01", pg::errc::connection_lost},
        {"08006", pg::errc::connection_lost},
        {"28P01", pg::errc::auth_failed},
        {"42P01", pg::errc::syntax_error},
        {"42601", pg::errc::syntax_error},
        {"22012", pg::errc::data_exception},
        {"53300", pg::errc::insufficient_resources},
        {"XX000", pg::errc::server_error},
        {"", pg::errc::server_error},
    };
    for (auto& row : table) BOOST_TEST((pg::errc_from_sqlstate(row.state) == row.want), row.state);
    BOOST_TEST(pg::is_transient(pg::errc::serialization_failure));
    BOOST_TEST(pg::is_transient(pg::errc::unavailable));
    BOOST_TEST(!pg::is_transient(pg::errc::unique_violation));
    BOOST_TEST(!pg::is_transient(pg::errc::syntax_error));
    BOOST_TEST(std::string(pg::error_class(make_error_code(pg::errc::deadlock))) == "deadlock");
    BOOST_TEST(std::string(pg::error_class(std::error_code())) == "ok");
}

BOOST_AUTO_TEST_CASE(int_and_bool_codecs) {
    BOOST_TEST(pg::parse_int64("-9223372036854775808").value() == INT64_MIN);
    BOOST_TEST(!pg::parse_int64("9223372036854775808"));
    BOOST_TEST(!pg::parse_int64(""));
    BOOST_TEST(!pg::parse_int64("12x"));
    BOOST_TEST(pg::parse_bool("t").value());
    BOOST_TEST(!pg::parse_bool("f").value());
    BOOST_TEST(!pg::parse_bool("yes"));
}

BOOST_AUTO_TEST_CASE(timestamptz_codec) {
    auto t = pg::parse_timestamptz("2024-02-29 23:59:59.5+00");
    BOOST_TEST_REQUIRE(t.has_value());
    BOOST_TEST(pg::format_timestamptz(*t) == "2024-02-29 23:59:59.500000+00");
    // Offsets are applied (other sessions' TimeZone settings), down to seconds.
    BOOST_TEST((pg::parse_timestamptz("2024-01-01 05:30:00+05:30") ==
                pg::parse_timestamptz("2024-01-01 00:00:00+00")));
    BOOST_TEST(
        (pg::parse_timestamptz("2023-12-31 23:00:00-01") == pg::parse_timestamptz("2024-01-01 00:00:00+00")));
    BOOST_TEST((pg::parse_timestamptz("1970-01-01 00:00:00+00")->time_since_epoch().count() == 0));
    BOOST_TEST((pg::parse_timestamptz("1970-01-01 00:00:00.000001+00")->time_since_epoch().count() == 1));
    for (auto bad : {"infinity", "2024-13-01 00:00:00+00", "2024-02-30 00:00:00+00", "2024-01-01 00:00:00",
                     "2024-01-01T00:00:00+00", "2024-01-01 00:00:00.1234567+00", "2024-01-01 00:00:00+00 BC"})
        BOOST_TEST(!pg::parse_timestamptz(bad).has_value(), bad);
    pg::timestamp old = sys_days(year{1} / 1 / 1) + microseconds(1);
    BOOST_TEST(pg::format_timestamptz(old) == "0001-01-01 00:00:00.000001+00");
    BOOST_TEST((pg::parse_timestamptz(pg::format_timestamptz(old)) == old));
}

BOOST_AUTO_TEST_CASE(bytea_codec) {
    BOOST_TEST((pg::parse_bytea_hex("\\x00ff10").value() == bytes{0x00, 0xff, 0x10}));
    BOOST_TEST(pg::parse_bytea_hex("\\x").value().empty());
    BOOST_TEST(!pg::parse_bytea_hex("00ff"));  // escape format is not hex output
    BOOST_TEST(!pg::parse_bytea_hex("\\x0"));
}

BOOST_AUTO_TEST_CASE(params_encoding) {
    pg::params p(std::int64_t{-5}, 7, std::int16_t{3}, true, "text", std::string("s"), pg::null,
                 std::optional<int>(), bytes{0, 1, 2});
    BOOST_TEST(p.size() == 9);
    auto v = p.values();
    BOOST_TEST(std::string(v[0]) == "-5");
    BOOST_TEST(p.types()[0] == pg::oid::int8);
    BOOST_TEST(p.types()[1] == pg::oid::int4);
    BOOST_TEST(p.types()[2] == pg::oid::int2);
    BOOST_TEST(std::string(v[3]) == "t");
    BOOST_TEST(p.types()[3] == pg::oid::bool_);
    BOOST_TEST(p.types()[4] == pg::oid::unknown);  // the server infers text/varchar/enum from context
    BOOST_TEST(v[6] == nullptr);
    BOOST_TEST(v[7] == nullptr);
    BOOST_TEST(p.types()[8] == pg::oid::bytea);
    BOOST_TEST(p.formats()[8] == 1);  // binary: no hex doubling
    BOOST_TEST(p.lengths()[8] == 3);
    BOOST_TEST((v[8][0] == 0 && v[8][1] == 1 && v[8][2] == 2));
    // Pointers are rebuilt after a move (short strings live inside std::string).
    pg::params moved = std::move(p);
    BOOST_TEST(std::string(moved.values()[4]) == "text");
}

BOOST_AUTO_TEST_CASE(dsn_parsing) {
    ::unsetenv("PGGSSENCMODE");
    auto c = pg::config::from_dsn("host=db1,db2 port=5433 dbname=ledger user=cg connect_timeout=3");
    BOOST_TEST_REQUIRE(c.has_value());
    BOOST_TEST_REQUIRE(c->endpoints.size() == 2u);
    BOOST_TEST(c->endpoints[1].host == "db2");
    BOOST_TEST(c->endpoints[1].port == "5433");  // one port applies to every host
    BOOST_TEST(c->get("dbname") == "ledger");
    BOOST_TEST((c->connect_timeout == seconds(3)));
    BOOST_TEST(c->get("gssencmode") == "disable");
    BOOST_TEST(c->get("host").empty());  // hosts are ours to resolve, never handed over as names alone
    BOOST_TEST(!c->dsn_has_password);
    auto uri = pg::config::from_dsn("postgresql://cg:secret@127.0.0.1:6543/ledger?application_name=x");
    BOOST_TEST_REQUIRE(uri.has_value());
    BOOST_TEST(uri->endpoints[0].host == "127.0.0.1");
    BOOST_TEST(uri->endpoints[0].port == "6543");
    BOOST_TEST(uri->dsn_has_password);
    BOOST_TEST(uri->describe().find("secret") == std::string::npos);
    auto sock = pg::config::from_dsn("host=/var/run/postgresql");
    BOOST_TEST(sock->endpoints[0].is_unix_socket());
    BOOST_TEST(pg::config::from_dsn("host=a,b port=1,2,3").code() == pg::errc::bad_config);
    BOOST_TEST(pg::config::from_dsn("port=http").code() == pg::errc::bad_config);
    auto bad = pg::config::from_dsn("host='unterminated");
    BOOST_TEST(bad.code() == pg::errc::bad_config);
    BOOST_TEST(bad.err().message.find("--pg-dsn") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dsn_falls_back_to_pg_environment) {
    ::setenv("PGHOST", "envhost", 1);
    ::setenv("PGPORT", "7777", 1);
    ::setenv("PGDATABASE", "envdb", 1);
    auto c = pg::config::from_dsn("");
    BOOST_TEST(c->endpoints[0].host == "envhost");
    BOOST_TEST(c->endpoints[0].port == "7777");
    BOOST_TEST(c->get("dbname") == "envdb");
    auto over = pg::config::from_dsn("dbname=flag");  // the flag wins over the environment
    BOOST_TEST(over->get("dbname") == "flag");
    BOOST_TEST(over->endpoints[0].host == "envhost");
    ::unsetenv("PGHOST");
    ::unsetenv("PGPORT");
    ::unsetenv("PGDATABASE");
}

BOOST_AUTO_TEST_CASE(backoff_doubles_to_a_cap) {
    milliseconds b{0};
    std::vector<long long> seen;
    for (int i = 0; i < 8; ++i) {
        b = pg::next_backoff(b, milliseconds(100), milliseconds(1000));
        seen.push_back(b.count());
    }
    std::vector<long long> want{100, 200, 400, 800, 1000, 1000, 1000, 1000};
    BOOST_TEST(seen == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(migration_names) {
    auto m = pg::make_migration("0042_add_things.sql", "SELECT 1;");
    BOOST_TEST_REQUIRE(m.has_value());
    BOOST_TEST(m->version == 42);
    BOOST_TEST(m->name == "0042_add_things");
    BOOST_TEST(m->checksum.size() == 64u);
    BOOST_TEST(pg::make_migration("42_x.sql", "").code() == pg::errc::bad_migration);
    BOOST_TEST(pg::make_migration("0001_x.txt", "").code() == pg::errc::bad_migration);
    std::vector<pg::migration> out_of_order{*pg::make_migration("0002_b.sql", ""),
                                            *pg::make_migration("0001_a.sql", "")};
    BOOST_TEST(pg::check_sequence(out_of_order).code() == pg::errc::bad_migration);
    auto embedded = pg::embedded_migrations();
    BOOST_TEST_REQUIRE(embedded.has_value());
    BOOST_TEST(embedded->front().name == "0001_billing_records");
    BOOST_TEST(embedded->front().sql.find("UNIQUE (customer_id, billing_period)") != std::string::npos);
}
