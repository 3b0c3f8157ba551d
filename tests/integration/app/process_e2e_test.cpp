// The built binary's process hygiene, end to end: the schema gate (an older database makes consume wait
// without consuming until it is migrated; a newer one starts only when declared compatible), N concurrent
// `chargeguard migrate` runs against one fresh database, --version, the refusal of plain-http origins and
// the key file's checks. Against fake-nsqd, fake-stripe (TLS) and scratch PostgreSQL databases; awaited on
// the child's log, its /startupz and /metrics, fake-nsqd and PostgreSQL — never on sleeps. Skipped (exit 77)
// without PGHOST.
//
// Here the schema gate and concurrent migrations; --version and the refusals at start are
// process_refusals_test.cpp.
#define BOOST_TEST_MODULE process_e2e
#define BOOST_TEST_NO_MAIN
#include "process_e2e.hpp"

#include <boost/test/unit_test.hpp>

#include "support/pg_main.hpp"

// A database one migration behind: consume starts its health server but does not subscribe to nsqd; it says
// why in its log, on /startupz and /readyz, and in chargeguard_schema_*; once `chargeguard migrate` runs it
// starts by itself and charges.
BOOST_FIXTURE_TEST_CASE(older_schema_waits_without_consuming_until_migrated, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        const int required = ms->back().version;
        co_await migrate(db.name, migrations_dir("old", required - 1));
        nsqd->publish(topic, event_json(1));

        auto& c = children.spawn(consume_args(db.name));
        co_await await_port(c);
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return has(c.err(), "database schema is older"); }, seconds(20)),
            c.err());
        char missing[64];
        std::snprintf(missing, sizeof missing, "missing %04d", required);
        auto st = co_await get(c, "/startupz");
        BOOST_TEST_REQUIRE(st.ok());
        BOOST_TEST(st.resp.status == 503);
        BOOST_TEST(has(st.resp.body, "WAIT schema: "), st.resp.body);
        BOOST_TEST(has(st.resp.body, missing), st.resp.body);
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST(ready.resp.status == 503);
        BOOST_TEST(has(ready.resp.body, "FAIL schema: "), ready.resp.body);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_ok") == 0);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_version") == required - 1);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_required_version") == required);
        BOOST_TEST(nsqd->client_count() == 0u);  // no live work: not even a subscription
        BOOST_TEST(nsqd->channel(topic, channel).finish_count == 0u);
        BOOST_TEST(fake->charges().empty());

        co_await migrate(db.name);
        BOOST_TEST_REQUIRE(co_await await_status(c, "/startupz", 200, seconds(30)), c.err());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            c.err());
        BOOST_TEST(fake->charges().size() == 1u);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_ok") == 1);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_version") == required);
        BOOST_TEST(has(c.err(), "database schema fits this binary"));
        co_await terminate(c);
    });
}

// With lookupd discovery and a topic nobody has published yet there is no nsqd to subscribe to: an
// nsqlookupd answering (404 TOPIC_NOT_FOUND) is NSQ reached, so /startupz passes (a native sidecar's startup
// probe must not keep the billing app, which creates the topic, from starting) while /readyz still says no
// nsqd is subscribed; once the topic has a producer, consume finds it and charges.
BOOST_FIXTURE_TEST_CASE(lookupd_answer_without_topic_completes_startup, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        test::nsq::fake_nsqlookupd lookupd(io.get_executor());
        BOOST_TEST_REQUIRE(lookupd.start().has_value());
        co_await migrate(db.name);
        auto args = consume_args(db.name);
        auto at = std::find(args.begin(), args.end(), "--nsqd-tcp-address");
        BOOST_TEST_REQUIRE((at != args.end()));
        *at = "--lookupd-http-address";
        *(at + 1) = lookupd.http_address();
        args.insert(args.end(), {"--lookupd-poll-interval", "1s"});
        auto& c = children.spawn(args);
        co_await await_port(c);
        BOOST_TEST_REQUIRE(co_await await_status(c, "/startupz", 200, seconds(30)), c.err());
        BOOST_TEST(lookupd.lookups() > 0u);
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST(ready.resp.status == 503, ready.resp.body);
        BOOST_TEST(nsqd->client_count() == 0u);

        nsqd->publish(topic, event_json(3));
        lookupd.add_producer(topic, nsqd->producer());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            c.err());
        BOOST_TEST(fake->charges().size() == 1u);
        co_await terminate(c);
        lookupd.stop();
    });
}

// A rollback: the database carries a migration newer than the binary. Declared compatible down to the
// binary's schema, consume starts; undeclared, it exits 1 at once, naming the versions.
BOOST_FIXTURE_TEST_CASE(newer_schema_starts_only_when_declared_compatible, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        const int required = ms->back().version;
        char next[16], req4[16];
        std::snprintf(next, sizeof next, "%04d", required + 1);
        std::snprintf(req4, sizeof req4, "%04d", required);
        const std::vector<std::pair<std::string, std::string>> compatible{
            {std::string(next) + "_future_column.sql",
             std::string("-- chargeguard: compatible-down-to ") + req4 +
                 "\nALTER TABLE billing_records ADD COLUMN future_note text;\n"}};
        auto compatible_dir = migrations_dir("compatible", required, compatible);
        co_await migrate(db.name, compatible_dir);
        nsqd->publish(topic, event_json(2));
        auto& ok = children.spawn(consume_args(db.name));
        co_await await_port(ok);
        BOOST_TEST_REQUIRE(co_await await_status(ok, "/startupz", 200, seconds(30)), ok.err());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            ok.err());
        BOOST_TEST(co_await gauge(ok, "chargeguard_schema_ok") == 1);
        BOOST_TEST(co_await gauge(ok, "chargeguard_schema_version") == required + 1);
        co_await terminate(ok);

        test::scratch_db other("process_newer");
        const std::vector<std::pair<std::string, std::string>> incompatible{
            {std::string(next) + "_future_table.sql", "CREATE TABLE future_thing (id integer);\n"}};
        auto incompatible_dir = migrations_dir("incompatible", required, incompatible);
        co_await migrate(other.name, incompatible_dir);
        auto& refused = children.spawn(consume_args(other.name));
        int rc = co_await wait_exit(refused, seconds(30));
        BOOST_TEST(rc == 1, refused.err());
        BOOST_TEST(has(refused.err(), "need binaries from " + std::string(next)), refused.err());
        BOOST_TEST(has(refused.err(), "incompatible database schema"), refused.err());
    });
}

// Five `chargeguard migrate` processes against one fresh database while this test holds the migration lock:
// all five wait on it (PostgreSQL shows five ungranted advisory locks), then exactly one applies every
// migration, the other four find them applied, and all exit 0.
BOOST_FIXTURE_TEST_CASE(concurrent_migrates_apply_once, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        auto holder = co_await pg->acquire();
        BOOST_TEST_REQUIRE(holder.has_value());
        auto locked = co_await (*holder)->query("SELECT pg_advisory_lock($1)", pg::migration_lock_key);
        BOOST_TEST_REQUIRE(locked.has_value());

        std::vector<child*> runs;
        for (int i = 0; i < 5; ++i)
            runs.push_back(&children.spawn({"migrate", "--pg-dsn", "dbname=" + db.name}));
        std::int64_t waiting = 0;
        auto end = steady_clock::now() + seconds(30);
        while (waiting < 5 && steady_clock::now() < end) {
            auto r = co_await query(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                "database = (SELECT oid FROM pg_database WHERE datname = current_database())");
            waiting = r.get<std::int64_t>(0, 0);
            if (waiting < 5) co_await net::sleep_for(milliseconds(20));
        }
        BOOST_TEST_REQUIRE(waiting == 5);
        for (auto* c : runs) BOOST_TEST(::waitpid(c->pid, nullptr, WNOHANG) == 0);  // all still waiting
        auto unlocked = co_await (*holder)->query("SELECT pg_advisory_unlock($1)", pg::migration_lock_key);
        BOOST_TEST_REQUIRE(unlocked.has_value());

        const std::string n = std::to_string(ms->size());
        int applied_all = 0, saw_applied = 0;
        for (auto* c : runs) {
            BOOST_TEST(co_await wait_exit(*c, seconds(60)) == 0, c->err());
            auto out = c->out();
            if (has(out, n + " applied, 0 already applied")) ++applied_all;
            if (has(out, "0 applied, " + n + " already applied")) ++saw_applied;
        }
        BOOST_TEST(applied_all == 1);
        BOOST_TEST(saw_applied == 4);
        auto rows = co_await query("SELECT count(*), count(DISTINCT version) FROM schema_migrations");
        BOOST_TEST(rows.get<std::int64_t>(0, 0) == static_cast<std::int64_t>(ms->size()));
        BOOST_TEST(rows.get<std::int64_t>(0, 1) == static_cast<std::int64_t>(ms->size()));
    });
}
