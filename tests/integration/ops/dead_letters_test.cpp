// ops_e2e: `dead-letters` list, show and replay — letters as the pipeline stores them, replays of failed and
// cap-blocked rows, a replay through the real nsqd — each replayed event charged exactly once by `consume`.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// Letters as the pipeline stores them; list/show; replay publishes the raw body once and records who/when;
// a second replay is skipped, --reason picks the open letters by reason, an invalid body is refused, --force
// publishes again; then `consume` charges each replayed event exactly once (the forced duplicate included).
BOOST_FIXTURE_TEST_CASE(dead_letters_list_show_replay_then_charged_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string a = event_json("cust-a", "2026-10", 1500, "cus_a");
        const std::string b = event_json("cust-b", "2026-10", 2500, "cus_b");
        auto id_a = co_await add_letter(a, "stripe rejected: No such customer");
        auto id_b = co_await add_letter(b, "stripe rejected: No such customer");
        auto id_bad = co_await add_letter("{\"customer_id\":\"cust-c\"}", "billing_period: missing");

        child* c = nullptr;
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "list", "--json", "--pg-dsn", dsn())) == 0, c->err());
        {
            std::istringstream in(c->out());
            std::string line;
            std::vector<std::int64_t> ids;
            simdjson::dom::parser p;
            while (std::getline(in, line)) {
                simdjson::dom::element doc;
                BOOST_TEST_REQUIRE(p.parse(line).get(doc) == simdjson::SUCCESS, line);
                ids.push_back(doc["id"].get_int64().value());
                BOOST_TEST(doc["topic"].get_string().value() == topic);
                BOOST_TEST(doc["replayed_at"].is_null());
            }
            BOOST_TEST((ids == std::vector<std::int64_t>{id_a, id_b, id_bad}));
        }
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "show", std::to_string(id_a), "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find(a) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("stripe rejected: No such customer") != std::string::npos);
        BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "show", "999999", "--pg-dsn", dsn())) == 2);

        auto replay = [&](auto... extra) {
            return argv("dead-letters", "replay", "--pg-dsn", dsn(), "--nsqd-tcp-address",
                        nsqd->tcp_address(), "--by", "alice", extra...);
        };
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a))) == 0, c->err());
        BOOST_TEST(nsqd->topic_message_count(topic) == 1u);
        auto marked = co_await query(
            "SELECT replayed_by, replayed_at IS NOT NULL, replay_count FROM dead_letters "
            "WHERE id = " +
            std::to_string(id_a));
        BOOST_TEST(marked.text(0, 0) == "alice");
        BOOST_TEST(marked.text(0, 1) == "t");
        BOOST_TEST(marked.text(0, 2) == "1");

        // Idempotent: replayed already → nothing published.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a))) == 0, c->err());
        BOOST_TEST(c->out().find("already replayed by alice") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 1u);

        // By reason: only the open letter with that reason (a is replayed already).
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay("--reason", "stripe rejected")) == 0, c->err());
        BOOST_TEST(c->out().find("1 replayed, 0 skipped") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        // A body consume would dead-letter again is refused, left open, not published.
        BOOST_TEST(co_await run_cmd(c, replay(std::to_string(id_bad))) == 1);
        BOOST_TEST(c->out().find("not a valid billing event") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        // --force publishes again and counts the replay.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a), "--force")) == 0, c->err());
        BOOST_TEST(nsqd->topic_message_count(topic) == 3u);
        auto twice =
            co_await query("SELECT replay_count FROM dead_letters WHERE id = " + std::to_string(id_a));
        BOOST_TEST(twice.text(0, 0) == "2");

        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "list", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("1 letter(s) open") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("billing_period: missing") != std::string::npos, c->out());

        // The replayed raw bodies are billing events: charged once each, the forced duplicate prevented.
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 3u; }, seconds(40)),
                           consumer.err());
        std::set<std::string> keys{key_of("cust-a", "2026-10"), key_of("cust-b", "2026-10")};
        co_await expect_charged_once(keys);
        co_await stop_cleanly(consumer);
    });
}

// A letter whose ledger row is final-but-uncharged — `failed` (Stripe refused the request as sent, since
// fixed) or `cap_blocked` (the cap, since raised) — is charged by its replay: the replay reopens the row,
// and consume searches Stripe, finds nothing and charges it under a new key generation, once. Without the
// reopen the replayed message would meet a final row and be finished as a duplicate: never charged.
BOOST_FIXTURE_TEST_CASE(a_replay_reopens_failed_and_cap_blocked_rows_and_charges_them, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-09";
        struct one {
            std::string customer, status;
        };
        std::vector<std::int64_t> ids;
        std::set<std::string> keys;
        for (const one& o : {one{"cust-f", "failed"}, one{"cust-g", "cap_blocked"}}) {
            auto key = key_of(o.customer, p);
            keys.insert(key);
            co_await query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status, last_error, stripe_attempts, first_stripe_attempt_at, "
                "last_stripe_attempt_at) VALUES ('" +
                key + "', '" + o.customer + "', '" + p + "', 3100, 'usd', 'cus_f', '" + o.status +
                "', 'refused', 1, now() - interval '10 minutes', now() - interval '10 minutes')");
            auto body = event_json(o.customer, p, 3100, "cus_f");
            auto r = co_await query(
                "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, "
                "billing_key) VALUES ('" +
                topic + "', '" + channel + "', '0a1b2c3d4e5f6072', 1, convert_to('" + body + "', 'UTF8'), '" +
                (o.status == "failed" ? "stripe rejected" : "spend cap exceeded") + "', '" + key +
                "') RETURNING id");
            ids.push_back(r.get<std::int64_t>(0, 0));
        }
        child* c = nullptr;
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "replay", std::to_string(ids[0]), std::to_string(ids[1]),
                                     "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address())) == 0,
            c->err());
        BOOST_TEST(c->out().find("reopened (was failed)") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("reopened (was cap_blocked)") != std::string::npos, c->out());
        auto open = co_await query(
            "SELECT count(*) FROM billing_records WHERE status = 'pending' AND "
            "indeterminate_since IS NOT NULL AND lease_until IS NULL");
        BOOST_TEST(open.text(0, 0) == "2");
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 2u; }, seconds(40)),
                           consumer.err());
        co_await expect_charged_once(keys);
        auto gens = co_await query(
            "SELECT count(*) FROM billing_records WHERE status = 'charged' AND key_generation = 2");
        BOOST_TEST(gens.text(0, 0) == "2");
        co_await stop_cleanly(consumer);
    });
}

// The same replay through the real nsqd 1.3.0: the body it delivers to `consume` is charged.
BOOST_FIXTURE_TEST_CASE(dead_letter_replay_through_real_nsqd, ops) {
    const char* bin = std::getenv("NSQD_BIN");
    if (!bin) {
        BOOST_TEST_MESSAGE("skipped: NSQD_BIN is not set (the real nsqd 1.3.0 is not on this machine)");
        return;
    }
    real_nsqd real(bin);
    run(*this, [&]() -> net::awaitable<void> {
        co_await migrate();
        // nsqd is up once a publish succeeds; the replay's producer retries its connect meanwhile.
        auto id =
            co_await add_letter(event_json("cust-r", "2026-10", 4100, "cus_r"), "stripe rejected: test");
        auto& consumer = spawn_consume(real.tcp_address());
        child* c = nullptr;
        bool published = false;
        for (int i = 0; i < 50 && !published; ++i) {
            published =
                co_await run_cmd(c, argv("dead-letters", "replay", std::to_string(id), "--pg-dsn", dsn(),
                                         "--nsqd-tcp-address", real.tcp_address(), "--by", "bob")) == 0;
            if (!published) co_await net::sleep_for(milliseconds(100));
        }
        BOOST_TEST_REQUIRE(published, c->err());
        BOOST_TEST_REQUIRE(co_await eventually([&] { return fake->charges().size() == 1u; }, seconds(40)),
                           consumer.err());
        std::set<std::string> keys{key_of("cust-r", "2026-10")};
        BOOST_TEST_REQUIRE(co_await eventually([&] { return charges_by_key().count(*keys.begin()) == 1u; }));
        auto rows = co_await query("SELECT replayed_by FROM dead_letters WHERE id = " + std::to_string(id));
        BOOST_TEST(rows.text(0, 0) == "bob");
        co_await stop_cleanly(consumer);
        co_await expect_charged_once(keys);
    });
}
