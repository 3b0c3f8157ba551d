// `chargeguard vault list`, `vault show` and `vault forfeit-lease` (the built binary) against a real
// PostgreSQL holding two cap leases of a key, taken by cg_vault_lease_take as a proxy takes them: one whose
// holder died (past its expiry), one whose holder is alive. The list shows what they hold, show lists them,
// and forfeit-lease gives back only the one named, refusing a live one unless --force.
#include <boost/test/unit_test.hpp>

#include "process_e2e.hpp"

namespace {

std::int64_t number(const pg::rows& r) {
    return r.get<std::int64_t>(0, 0);
}

}  // namespace

BOOST_FIXTURE_TEST_CASE(vault_commands_show_and_forfeit_a_keys_cap_leases, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        co_await migrate(db.name);
        const std::string dsn = "dbname=" + db.name;
        const std::vector<std::string> issue{"vault",
                                             "issue",
                                             "--pg-dsn",
                                             dsn,
                                             "--name",
                                             "leases",
                                             "--period",
                                             "2026-11",
                                             "--currency",
                                             "usd",
                                             "--expected-total-cents",
                                             "100000"};
        auto [rc, issued] = co_await run_to_exit(issue);
        BOOST_TEST_REQUIRE(rc == 0, issued);
        const std::string id = (co_await query("SELECT id FROM vault_keys")).get<std::string>(0, 0);
        const std::string key = "'" + id + "'";
        // A dead holder's lease (1 ms to live: never renewed) and a live one's (10 minutes).
        co_await query("SELECT cg_vault_lease_take(" + key + ", NULL, 'dead-host:1:0f', 5000, 1, 1)");
        co_await query("SELECT cg_vault_lease_take(" + key + ", NULL, 'live-host:2:0e', 3000, 1, 600000)");
        const auto dead =
            number(co_await query("SELECT id FROM vault_leases WHERE holder = 'dead-host:1:0f'"));
        // Its expiry is PostgreSQL's clock: polled until it has passed.
        bool expired = false;
        for (int i = 0; i < 200; ++i) {
            expired = (co_await query("SELECT expires_at < now() FROM vault_leases WHERE id = " +
                                      std::to_string(dead)))
                          .get<bool>(0, 0);
            if (expired) break;
            co_await net::sleep_for(milliseconds(5));
        }
        BOOST_TEST_REQUIRE(expired);

        // list: the LEASED column and leased_cents.
        const std::vector<std::string> args1{"vault", "list", "--pg-dsn", dsn};
        auto [lrc, list] = co_await run_to_exit(args1);
        BOOST_TEST(lrc == 0, list);
        BOOST_TEST(has(list, "LEASED"), list);
        BOOST_TEST(has(list, " 8000 "), list);
        const std::vector<std::string> args2{"vault", "list", "--pg-dsn", dsn, "--json"};
        auto [jrc, json] = co_await run_to_exit(args2);
        BOOST_TEST(jrc == 0, json);
        BOOST_TEST(has(json, "\"leased_cents\":8000"), json);

        // show: both leases, the dead one marked stranded.
        const std::vector<std::string> args3{"vault", "show", id, "--pg-dsn", dsn};
        auto [src, show] = co_await run_to_exit(args3);
        BOOST_TEST(src == 0, show);
        BOOST_TEST(has(show, "2 open cap leases:"), show);
        BOOST_TEST(has(show, "holder dead-host:1:0f  held 5000 cents"), show);
        BOOST_TEST(has(show, "holder live-host:2:0e  held 3000 cents"), show);
        const auto stranded_at = show.find("(expired: stranded");
        BOOST_TEST(
            (stranded_at != std::string::npos && show.find("(expired", stranded_at + 1) == std::string::npos),
            show);
        // ... on the dead holder's line.
        const auto line_start = show.rfind('\n', stranded_at);
        BOOST_TEST(show.substr(line_start, stranded_at - line_start).find("dead-host") != std::string::npos,
                   show);
        const std::vector<std::string> args4{"vault", "show", id, "--pg-dsn", dsn, "--json"};
        auto [sjrc, sjson] = co_await run_to_exit(args4);
        BOOST_TEST(sjrc == 0, sjson);
        BOOST_TEST(has(sjson, "\"holder\":\"dead-host:1:0f\",\"held_cents\":5000"), sjson);
        BOOST_TEST(has(sjson, "\"expired\":true"), sjson);
        BOOST_TEST(has(sjson, "\"expired\":false"), sjson);

        const std::string leased = "SELECT leased_cents FROM vault_keys WHERE id = " + key;
        // Two open leases and none named: refused, nothing forfeited.
        const std::vector<std::string> args0{"vault", "forfeit-lease", id, "--pg-dsn",
                                             dsn,     "--keep-cents",  "0"};
        auto [a_rc, a] = co_await run_to_exit(args0);
        BOOST_TEST(a_rc == 1, a);
        BOOST_TEST(has(a, "has 2 open leases; name one with --lease"), a);
        const auto got1 = number(co_await query(leased));
        BOOST_TEST(got1 == 8000);
        // The live holder's lease has not expired: refused without --force.
        const std::vector<std::string> args5{
            "vault", "forfeit-lease", id, "--pg-dsn", dsn, "--holder", "live-host:2:0e", "--keep-cents", "0"};
        auto [b_rc, b] = co_await run_to_exit(args5);
        BOOST_TEST(b_rc == 1, b);
        BOOST_TEST(has(b, "has not expired"), b);
        BOOST_TEST(has(b, "nothing forfeited"), b);
        const auto got2 = number(co_await query(leased));
        BOOST_TEST(got2 == 8000);
        // The dead holder's, keeping 1200 cents its holder forwarded without a row: the rest goes back.
        const std::vector<std::string> args6{
            "vault",          "forfeit-lease", id,    "--pg-dsn", dsn, "--holder",
            "dead-host:1:0f", "--keep-cents",  "1200"};
        auto [c_rc, c] = co_await run_to_exit(args6);
        BOOST_TEST(c_rc == 0, c);
        BOOST_TEST(has(c, "forfeited lease " + std::to_string(dead)), c);
        BOOST_TEST(has(c, "3800 cents back to the cap, 1200 cents kept counted"), c);
        const auto got3 = number(co_await query(leased));
        BOOST_TEST(got3 == 3000);
        const auto got4 = number(co_await query("SELECT committed_cents FROM vault_keys WHERE id = " + key));
        BOOST_TEST(got4 == 1200);
        BOOST_TEST(
            number(co_await query("SELECT count(*) FROM vault_leases WHERE closed_by = 'forfeit' AND id = " +
                                  std::to_string(dead))) == 1);
        // Once forfeited it is gone.
        const std::vector<std::string> args7{
            "vault", "forfeit-lease", id, "--pg-dsn", dsn, "--lease", std::to_string(dead), "--keep-cents",
            "0"};
        auto [d_rc, d] = co_await run_to_exit(args7);
        BOOST_TEST(d_rc == 1, d);
        BOOST_TEST(has(d, "has no open lease " + std::to_string(dead)), d);
        // --force forfeits the live one: the key leases nothing more.
        const std::vector<std::string> args8{
            "vault",          "forfeit-lease", id,  "--pg-dsn", dsn, "--holder",
            "live-host:2:0e", "--keep-cents",  "0", "--force"};
        auto [e_rc, e] = co_await run_to_exit(args8);
        BOOST_TEST(e_rc == 0, e);
        BOOST_TEST(has(e, "not expired: forced"), e);
        BOOST_TEST(has(e, "3000 cents back to the cap, 0 cents kept counted"), e);
        const auto got5 = number(co_await query(leased));
        BOOST_TEST(got5 == 0);
        const auto got6 = number(co_await query("SELECT count(*) FROM vault_leases WHERE closed_at IS NULL"));
        BOOST_TEST(got6 == 0);
    });
}
