// A PostgreSQL failover that lost the last commits (billing/heal/sweeper.hpp, pg::pool::on_failover), on a
// primary and a streaming standby of the test's own (ci/pg-cluster start / standby / crash / promote): the
// consume's pool sees the promoted standby on its next connection (a new timeline, another address) and the
// sweeper, with the default sweep settings, settles the rows the failover returned to `pending`: those it
// settled itself under a lease the new primary still shows as its own at once from its memory of them, the
// others after a short grace — a row whose lease another holder took too, once nothing renewed that lease
// since the failover, while a row whose holder keeps renewing it is left to that holder — each by the payment
// Stripe already made under its key, never by a second one. Without the detection those rows wait out the
// sweep bound (430 s with the defaults). Needs CHARGEGUARD_TEST_PG_CTL (ci/lib.sh) and
// pg_basebackup; leaves the shared server alone. g++ 12 -O2 false positive on Asio coroutine frames (GCC bug
// 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#define BOOST_TEST_MODULE billing_failover
#define BOOST_TEST_NO_MAIN
#include <libpq-fe.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "billing/heal/sweeper.hpp"
#include "fixture.hpp"
#include "net/timeout.hpp"
#include "support/pg_main.hpp"
#include "support/pg_server_ctl.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::key_of;
using cg::test::run_async;

namespace {

using fixture = test::billing_fixture;
using clock_type = std::chrono::steady_clock;

// A primary and its streaming standby in a scratch directory, both on loopback ports of their own.
struct cluster_pair {
    std::string ctl, root, primary, standby;
    unsigned short primary_port = 0, standby_port = 0;

    cluster_pair() {
        test::pg_server_ctl srv("create a primary and its standby");
        ctl = srv.ctl;
        root = "/tmp/cg-failover-" + std::to_string(::getpid());
        primary = root + "/primary";
        standby = root + "/standby";
        primary_port = test::closed_port();
        do standby_port = test::closed_port();
        while (standby_port == primary_port);
        shell("rm -rf '" + root + "'");
        sh("start '" + primary + "' " + std::to_string(primary_port));
        sh("standby '" + standby + "' " + std::to_string(standby_port) + " '" + primary + "'");
    }
    ~cluster_pair() {
        shell("'" + ctl + "' stop '" + primary + "' >/dev/null 2>&1");
        shell("'" + ctl + "' stop '" + standby + "' >/dev/null 2>&1");
        shell("rm -rf '" + root + "'");
    }
    // Until the standby has replayed everything the primary wrote so far (WAL is polled: pg_ctl has no wait).
    void wait_standby_replayed() const {
        const auto lsn = value(primary_port, "SELECT pg_current_wal_lsn()");
        const auto caught_up = "SELECT pg_last_wal_replay_lsn() >= '" + lsn + "'";
        for (int i = 0; i < 200 && value(standby_port, caught_up) != "t"; ++i)
            std::this_thread::sleep_for(50ms);
        BOOST_TEST_REQUIRE(value(standby_port, caught_up) == "t");
    }
    static int shell(const std::string& cmd) { return std::system(cmd.c_str()); }
    // pg_ctl waits: never while the loop has work (the test calls it between runs of the loop).
    void sh(const std::string& args) const {
        int rc = shell("'" + ctl + "' " + args + " >/dev/null");
        BOOST_TEST_REQUIRE(rc == 0, "ci/pg-cluster " << args);
    }
    // As the consumers of a failover deployment are configured: both hosts, the writable one wins.
    pg::config both() const {
        return test::server_config("host=127.0.0.1,127.0.0.1 port=" + std::to_string(primary_port) + "," +
                                   std::to_string(standby_port) +
                                   " dbname=chargeguard_test user=postgres target_session_attrs=read-write");
    }
    // One value by libpq's synchronous API on `port` (setting up and checking, never on the loop).
    static std::string value(unsigned short port, const std::string& sql) {
        auto dsn = "host=127.0.0.1 port=" + std::to_string(port) + " dbname=chargeguard_test user=postgres";
        PGconn* c = PQconnectdb(dsn.c_str());
        std::string out, err;
        if (PQstatus(c) != CONNECTION_OK) {
            err = PQerrorMessage(c);
        } else {
            PGresult* r = PQexec(c, sql.c_str());
            if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                out = PQgetvalue(r, 0, 0);
            else
                err = PQresultErrorMessage(r);
            PQclear(r);
        }
        PQfinish(c);
        BOOST_TEST_REQUIRE(err.empty(), sql << ": " << err);
        return out;
    }
};

double failovers_seen(metrics::registry& reg) {
    return test::first_sample(reg, "chargeguard_pg_failovers_detected_total");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_failover)

// Four rows charged at Stripe by this sidecar whose `charged` commits the failover lost (their messages
// FINed, gone), as the new primary shows them: one still leased under the epoch this sidecar's delivery held
// (its lease write committed, its settle did not); one with no live lease whose epoch another worker moved
// since; one whose lease another (dead) holder took and still holds there for 50 s; one whose lease another
// holder took and keeps renewing after the failover, as a live delivery's lease keeper does while its call is
// awaited. The first is re-applied from the sidecar's memory of its settle within seconds of the detection
// (settle_journal.hpp). The second and the third are charged once the failover grace (two lease renewals and
// an interval) has passed: the dead holder's lease, unwritten since the failover, is ended then rather than
// waited out. The fourth is left alone (no write, no Stripe call) while its holder renews it. All within
// 60 s of the failover, by the payment made under their key (one payment each at Stripe).
BOOST_AUTO_TEST_CASE(rows_a_failover_returned_to_pending_are_settled_within_a_minute_and_charged_once) {
    if (::access("/usr/lib/postgresql/15/bin/pg_basebackup", X_OK) != 0) {
        BOOST_TEST_MESSAGE("skipped: no pg_basebackup (ci/pg-cluster standby needs it)");
        return;
    }
    cluster_pair cl;
    metrics::registry reg;  // outlives the pool, whose metrics it holds
    fixture f;
    // The ledger on the pair, through a pool that watches for failovers as consume's does.
    run_async(f.io, [&]() -> net::awaitable<void> { co_await f.pg->close(); });
    pg::pool_options o;
    o.server = cl.both();
    o.server.connect_timeout = 2s;
    o.size = 4;
    o.watch_failover = true;
    o.failover_record = test::key_namespace;  // as consume: its detection is recorded too, counted once
    f.pg = pg::pool::create(f.io.get_executor(), f.pool.get_executor(), std::move(o), logger(), &reg);
    f.pg->start();
    f.ledger = std::make_unique<billing::ledger>(f.pg);
    auto migrated = f.run(f.boxed_migrate());
    BOOST_TEST_REQUIRE(migrated.has_value(), (migrated ? "" : migrated.err().describe()));

    billing::charge_flow_config pc;  // the defaults: a 60 s lease
    pc.key_namespace = test::key_namespace;
    auto p = f.make_pipeline(pc);
    const auto own_key = key_of("fo-0", "2026-11");
    const auto free_key = key_of("fo-1", "2026-11");
    const auto leased_key = key_of("fo-2", "2026-11");
    const auto live_key = key_of("fo-3", "2026-11");
    for (auto [customer, id] : {std::pair{"fo-0", "f000"}, std::pair{"fo-1", "f001"},
                                std::pair{"fo-2", "f002"}, std::pair{"fo-3", "f003"}}) {
        auto v = f.handle(*p, delivery_of(event_json(customer, "2026-11", 1999), id));
        BOOST_TEST_REQUIRE(billing::to_string(v.reason) == "charged", v.detail);
    }
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 4u);
    BOOST_TEST_REQUIRE(p->journal().size() == 4u);
    // What the standby holds when the settles were lost: the rows pending without Stripe ids; the own row
    // leased under the epoch its delivery held (as just after its pre-flight: the settle moved it by one),
    // the free one released under an epoch another worker wrote, the leased and the live ones taken by
    // other holders.
    auto lost = f.run(f.query(
        "UPDATE billing_records SET status = 'pending', charge_id = NULL, payment_intent_id = NULL, "
        "lease_until = CASE WHEN key = $2 THEN now() - interval '1 s' ELSE now() + interval '50 s' END, "
        "lease_epoch = CASE WHEN key = $1 THEN lease_epoch - 1 ELSE lease_epoch + 1 END "
        "WHERE key IN ($1, $2, $3, $4) RETURNING lease_epoch",
        pg::params(own_key, free_key, leased_key, live_key)));
    BOOST_TEST_REQUIRE(lost.has_value(), (lost ? "" : lost.err().describe()));
    // The standby has it all before the primary fails.
    cl.wait_standby_replayed();

    // The sweeper as consume starts it: default bound (2 × 60 s + 300.1 s + 10 s) and interval (60 s).
    auto s =
        billing::start_sweeper(f.io.get_executor(), *p, f.pg, billing::sweeper_config{}, 60s, reg, logger());
    BOOST_TEST_REQUIRE(s->config().after > 400s);
    BOOST_TEST(failovers_seen(reg) == 0.0);

    cl.sh("crash '" + cl.primary + "'");
    cl.sh("promote '" + cl.standby + "'");
    const auto failed_over = clock_type::now();

    // Watches the ledger (through the same pool: its broken connections are replaced on the promoted
    // standby) until the rows are charged or 60 s have passed; notes when each was first seen charged.
    // Meanwhile, once the failover was seen, renews the live row's lease every 10 s as its holder's lease
    // keeper would (renew_sql: the epoch moved, the lease extended, the call noted in flight), each renewal
    // under the epoch the last one left.
    std::optional<clock_type::duration> own_at, free_at, leased_at, detected_at;
    std::optional<clock_type::time_point> renewed_at;
    std::string live_epoch, live_lost;
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            while (clock_type::now() - failed_over < 60s && !(own_at && free_at && leased_at)) {
                if (!detected_at && failovers_seen(reg) > 0.0) detected_at = clock_type::now() - failed_over;
                if (detected_at && live_lost.empty() &&
                    (!renewed_at || clock_type::now() - *renewed_at > 10s)) {
                    auto renewed = co_await f.query(
                        "UPDATE billing_records SET lease_until = now() + interval '50 s', "
                        "lease_epoch = lease_epoch + 1, last_stripe_attempt_at = now() "
                        "WHERE key = $1 AND status = 'pending' AND lease_epoch = coalesce(nullif($2::text, "
                        "'')::bigint, lease_epoch) "
                        "RETURNING lease_epoch::text",
                        pg::params(live_key, live_epoch));
                    if (renewed && renewed->size() == 1) {
                        live_epoch = renewed->get<std::string>(0, 0);
                        renewed_at = clock_type::now();
                    } else if (renewed) {
                        live_lost = "the live holder's lease was taken over (epoch " + live_epoch + ")";
                    }
                }
                auto r = co_await f.query("SELECT key, status FROM billing_records WHERE key IN ($1, $2, $3)",
                                          pg::params(own_key, free_key, leased_key));
                if (r && r->size() == 3) {
                    for (std::size_t i = 0; i < 3; ++i) {
                        const auto key = r->get<std::string>(i, 0);
                        const bool charged = r->get<std::string>(i, 1) == "charged";
                        if (key == own_key && charged && !own_at) own_at = clock_type::now() - failed_over;
                        if (key == free_key && charged && !free_at) free_at = clock_type::now() - failed_over;
                        if (key == leased_key && charged && !leased_at)
                            leased_at = clock_type::now() - failed_over;
                    }
                }
                co_await net::sleep_for(100ms);
            }
        },
        75s);
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    BOOST_TEST_REQUIRE(detected_at.has_value(), "the failover was not detected");
    BOOST_TEST_REQUIRE(own_at.has_value(), "the row this sidecar settled was not charged within 60 s");
    BOOST_TEST_MESSAGE("failover detected " << duration_cast<milliseconds>(*detected_at).count()
                                            << " ms after it; the row leased by the sidecar that charged it "
                                               "re-applied "
                                            << duration_cast<milliseconds>(*own_at).count()
                                            << " ms after it");
    // From the sidecar's memory, within seconds of the detection: not after its lease (50 s), nor the grace.
    BOOST_TEST(*own_at < *detected_at + 5s);
    BOOST_TEST(*own_at < 15s);
    BOOST_TEST(test::first_sample(reg, "chargeguard_billing_failover_reapplied_total") == 1.0);
    BOOST_TEST_REQUIRE(free_at.has_value(), "the row with no live lease was not charged within 60 s");
    BOOST_TEST_MESSAGE("row with no live lease charged " << duration_cast<milliseconds>(*free_at).count()
                                                         << " ms after the failover");
    // Not before the grace (two lease renewals and an interval: 32 s), within a few seconds after it.
    BOOST_TEST(*free_at >= 31s);
    BOOST_TEST(*free_at < 40s);
    // The row a dead holder leased for 50 s more: nothing renewed it since the failover, so its lease was
    // ended with the grace's first sweep rather than waited out (it would run until 45–50 s).
    BOOST_TEST_REQUIRE(leased_at.has_value(), "the leased row was not charged within 60 s of the failover");
    BOOST_TEST_MESSAGE("row whose lease a dead holder held 50 s more charged "
                       << duration_cast<milliseconds>(*leased_at).count() << " ms after the failover");
    BOOST_TEST(*leased_at >= 31s);  // not before the grace: a live holder renews within it
    BOOST_TEST(*leased_at < 40s);
    BOOST_TEST(test::first_sample(reg, "chargeguard_billing_failover_leases_ended_total") == 1.0);
    // The row whose holder kept renewing its lease was left to it: every renewal found the lease where the
    // last one left it, the row still pending, no second call at Stripe.
    BOOST_TEST(live_lost.empty(), live_lost);
    BOOST_TEST(!live_epoch.empty());
    BOOST_TEST(
        cl.value(cl.standby_port, "SELECT status || '/' || lease_epoch FROM billing_records WHERE key = '" +
                                      live_key + "'") == "pending/" + live_epoch);
    BOOST_TEST(f.fake->posts_for(live_key) == 1);
    // Charged by the payments made before the failover: one each at Stripe (the swept rows' recovery sent
    // their key again, which Stripe answered with the same payment; the re-applied row called nothing), the
    // rows holding their ids.
    BOOST_TEST(f.fake->charges().size() == 4u);
    BOOST_TEST(f.fake->posts_for(own_key) == 1);
    for (const auto& key : {own_key, free_key, leased_key}) {
        auto row = f.row(key);
        BOOST_TEST_REQUIRE(row.has_value());
        BOOST_TEST(row->charge_id.has_value());
    }
    BOOST_TEST(failovers_seen(reg) == 1.0);
    BOOST_TEST(cl.value(cl.standby_port, "SELECT pg_is_in_recovery()::text") == "false");

    run_async(f.io, [&]() -> net::awaitable<void> { co_await s->stop(); });
}

// A sidecar started only after the failover never saw the server before it: its pool finds the promoted
// standby's timeline differs from the one recorded in the ledger (pg_server_seen, migration 0024) by the
// sidecar that ran before, reports the failover as one it saw itself, and its sweeper settles the row the
// failover returned to pending (charged at Stripe, its message FINed) within 60 s of the promotion with the
// default settings, by the payment already made. Without the record the row would wait for the sweep bound.
BOOST_AUTO_TEST_CASE(a_sidecar_started_after_the_failover_settles_the_rows_it_returned_to_pending) {
    if (::access("/usr/lib/postgresql/15/bin/pg_basebackup", X_OK) != 0) {
        BOOST_TEST_MESSAGE("skipped: no pg_basebackup (ci/pg-cluster standby needs it)");
        return;
    }
    cluster_pair cl;
    metrics::registry before_reg, after_reg;  // each outlives its pool
    fixture f;
    auto watching_pool = [&](metrics::registry& reg) {
        pg::pool_options o;
        o.server = cl.both();
        o.server.connect_timeout = 2s;
        o.size = 4;
        o.health_interval = 1s;  // the record is retried by the maintenance once the migrations made it
        o.watch_failover = true;
        o.failover_record = test::key_namespace;
        return pg::pool::create(f.io.get_executor(), f.pool.get_executor(), std::move(o), logger(), &reg);
    };
    // The sidecar before the failover: it migrates, charges, and records the primary it reached.
    run_async(f.io, [&]() -> net::awaitable<void> { co_await f.pg->close(); });
    f.pg = watching_pool(before_reg);
    f.pg->start();
    f.ledger = std::make_unique<billing::ledger>(f.pg);
    auto migrated = f.run(f.boxed_migrate());
    BOOST_TEST_REQUIRE(migrated.has_value(), (migrated ? "" : migrated.err().describe()));
    billing::charge_flow_config pc;  // the defaults: a 60 s lease
    pc.key_namespace = test::key_namespace;
    const auto key = key_of("fl-0", "2026-11");
    {
        auto p = f.make_pipeline(pc);
        auto v = f.handle(*p, delivery_of(event_json("fl-0", "2026-11", 1999), "fl00"));
        BOOST_TEST_REQUIRE(billing::to_string(v.reason) == "charged", v.detail);
    }
    const auto recorded =
        "SELECT timeline::text FROM pg_server_seen WHERE name = '" + std::string(test::key_namespace) + "'";
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            for (int i = 0; i < 100; ++i) {
                auto r = co_await f.query(recorded, pg::params());
                if (r && r->size() == 1) co_return;
                co_await net::sleep_for(100ms);
            }
        },
        15s);
    const auto old_timeline = cl.value(cl.primary_port, recorded);
    // What the standby holds when the settle was lost: pending without Stripe ids, no live lease, its epoch
    // moved by another worker (not this process's to re-apply).
    auto lost = f.run(f.query(
        "UPDATE billing_records SET status = 'pending', charge_id = NULL, payment_intent_id = NULL, "
        "lease_until = now() - interval '1 s', lease_epoch = lease_epoch + 1 WHERE key = $1 RETURNING key",
        pg::params(key)));
    BOOST_TEST_REQUIRE(lost.has_value(), (lost ? "" : lost.err().describe()));
    cl.wait_standby_replayed();
    run_async(f.io, [&]() -> net::awaitable<void> { co_await f.pg->close(); });
    f.ledger.reset();

    cl.sh("crash '" + cl.primary + "'");
    cl.sh("promote '" + cl.standby + "'");
    const auto failed_over = clock_type::now();

    // The sidecar started after it, as consume starts one: the sweeper with the default bound (> 400 s).
    f.pg = watching_pool(after_reg);
    f.ledger = std::make_unique<billing::ledger>(f.pg);
    auto p = f.make_pipeline(pc);
    auto s = billing::start_sweeper(f.io.get_executor(), *p, f.pg, billing::sweeper_config{}, 60s, after_reg,
                                    logger());
    BOOST_TEST_REQUIRE(s->config().after > 400s);
    f.pg->start();
    std::optional<clock_type::duration> detected_at, charged_at;
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            while (clock_type::now() - failed_over < 60s && !charged_at) {
                if (!detected_at && failovers_seen(after_reg) > 0.0)
                    detected_at = clock_type::now() - failed_over;
                auto r =
                    co_await f.query("SELECT status FROM billing_records WHERE key = $1", pg::params(key));
                if (r && r->size() == 1 && r->get<std::string>(0, 0) == "charged")
                    charged_at = clock_type::now() - failed_over;
                co_await net::sleep_for(100ms);
            }
        },
        75s);
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    BOOST_TEST_REQUIRE(detected_at.has_value(), "the failover before the start was not detected");
    BOOST_TEST_REQUIRE(charged_at.has_value(), "the row was not charged within 60 s of the failover");
    BOOST_TEST_MESSAGE("a sidecar started after the failover detected it "
                       << duration_cast<milliseconds>(*detected_at).count() << " ms and charged the row "
                       << duration_cast<milliseconds>(*charged_at).count() << " ms after the promotion");
    BOOST_TEST(failovers_seen(after_reg) == 1.0);
    BOOST_TEST(failovers_seen(before_reg) == 0.0);
    // One payment at Stripe, the row holding its id; the new server is recorded for the next sidecar.
    BOOST_TEST(f.fake->charges().size() == 1u);
    auto row = f.row(key);
    BOOST_TEST_REQUIRE(row.has_value());
    BOOST_TEST(row->charge_id.has_value());
    BOOST_TEST(cl.value(cl.standby_port, recorded) != old_timeline);

    run_async(f.io, [&]() -> net::awaitable<void> { co_await s->stop(); });
}

BOOST_AUTO_TEST_SUITE_END()
