// ops_e2e: every dead letter can be closed — refused replays, an invalid event's letter found by `explain`
// and replayed corrected, dismissals — and the open-letters gauge follows.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// The issue's third incident: every dead letter can be closed. A conflict letter's replay is refused — it
// would only be dead-lettered again — and publishes nothing (no new letter); an invalid event's letter is
// refused as it is, `explain` finds it by the customer and period in its body, and its replay with a
// corrected event charges once and keeps the correction beside the original; the rest are dismissed with a
// reason. The open-letters gauge counts them by reason while open and drops to 0 once closed.
BOOST_FIXTURE_TEST_CASE(every_dead_letter_can_be_closed, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-04";
        nsqd->publish(topic, event_json("x1", p, 1500, "cus_x1"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        // An invalid amount (a decimal) for c-21; the same customer and period as x1 with another amount; a
        // test event nobody should charge. One after the other: letters 1, 2 and 3, as the runbook shows
        // them.
        const std::string invalid =
            R"({"customer_id":"c-21","billing_period":")" + p +
            R"(","amount_cents":19.99,"currency":"usd","stripe_customer_id":"cus_c21"})";
        const std::string bodies[] = {invalid, event_json("x1", p, 2500, "cus_x1"),
                                      R"({"customer_id":"smoke-test"})"};
        for (std::size_t i = 0; i < std::size(bodies); ++i) {
            nsqd->publish(topic, bodies[i]);
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 2u + i; },
                                    seconds(40)),
                consumer.err());
        }
        // Dead letters are logged at warn.
        BOOST_TEST(consumer.err().find("\"level\":\"warn\",\"msg\":\"billing message finished\"") !=
                       std::string::npos,
                   consumer.err());
        auto ids =
            co_await query("SELECT string_agg(id || ' ' || reason, '; ' ORDER BY id) FROM dead_letters");
        BOOST_TEST_REQUIRE(
            std::string(ids.text(0, 0)).rfind("1 event field is invalid: amount_cents", 0) == 0u,
            ids.text(0, 0));
        BOOST_TEST_REQUIRE(
            std::string(ids.text(0, 0)).find("; 2 conflict; 3 event lacks") != std::string::npos,
            ids.text(0, 0));
        const std::string invalid_id = "1", conflict_id = "2", smoke_id = "3";

        // The gauge: open letters by reason class.
        std::optional<unsigned short> port;
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return (port = consumer.logged_port()).has_value(); }, seconds(20)));
        auto scrape = [&](unsigned short at) -> net::awaitable<std::string> {
            auto cl = http::client::create(io.get_executor(), "http://127.0.0.1:" + std::to_string(at), {},
                                           logger());
            BOOST_TEST_REQUIRE(cl.has_value());
            http::request req;
            req.target = "/metrics";
            auto r = co_await (*cl)->request(std::move(req));
            BOOST_TEST_REQUIRE(r.ok());
            co_return r.resp.body;
        };
        std::string metrics;
        for (int i = 0; i < 400; ++i) {
            metrics = co_await scrape(*port);
            if (scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 2) break;
            co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 2, metrics);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"conflict\"}") == 1);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"stripe_rejected\"}") == 0);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_dismissed") == 0);

        auto replay = [&](std::vector<std::string> extra) {
            auto a = argv("dead-letters", "replay", "--pg-dsn", dsn(), "--nsqd-tcp-address",
                          nsqd->tcp_address(), "--by", "alice");
            a.insert(a.end(), extra.begin(), extra.end());
            return a;
        };
        child* c = nullptr;
        // The conflict letter: refused, truthfully, and nothing published (no new letter).
        BOOST_TEST(co_await run_cmd(c, replay(argv(conflict_id))) == 1, c->err());
        BOOST_TEST(
            c->out().find("refused, nothing published: ledger row " + key_of("x1", p) +
                          " holds 1500 usd for cus_x1, this event says 2500 usd for cus_x1: it would be "
                          "dead-lettered again as a conflict") != std::string::npos,
            c->out());
        BOOST_TEST(
            c->out().find("0 replayed, 0 skipped (closed already), 1 refused, 0 failed") != std::string::npos,
            c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 2 --nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST(nsqd->topic_message_count(topic) == 4u);
        // A letter whose event was charged meanwhile: superseded, nothing published.
        auto stale =
            co_await add_letter(event_json("x1", p, 1500, "cus_x1"), "stripe rejected: No such customer");
        BOOST_TEST(co_await run_cmd(c, replay(argv(std::to_string(stale)))) == 1, c->err());
        BOOST_TEST(c->out().find("refused, nothing published: superseded: ledger row " + key_of("x1", p) +
                                 " is charged (ch_") != std::string::npos,
                   c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 4u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", std::to_string(stale),
                                                    "--reason", "charged meanwhile", "--pg-dsn", dsn())) ==
                           0);

        // The invalid letter as it is: refused. explain finds it by its body, not "never seen".
        BOOST_TEST(co_await run_cmd(c, replay(argv(invalid_id))) == 1);
        BOOST_TEST(c->out().find("the body is not a valid billing event") != std::string::npos, c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 1 --nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "c-21", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 2,
            c->err());
        BOOST_TEST(runbook_mismatch("chargeguard explain --customer c-21 --period 2026-04", c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, argv("explain", "--customer", "c-21", "--period", p, "--key-namespace",
                                            key_namespace, "--pg-dsn", dsn(), "--json")) == 2,
                   c->err());
        auto x = parse_explained(c->out());
        BOOST_TEST(x.state == "dead_lettered");
        BOOST_TEST(x.verdict.rfind("dead-lettered: event field is invalid: amount_cents", 0) == 0u,
                   x.verdict);
        BOOST_TEST(x.verdict.find("dead-letters replay " + invalid_id) != std::string::npos, x.verdict);
        BOOST_TEST(x.letters == 1u);

        // Replayed with the corrected event: charged once, the correction kept with the letter.
        const std::string fixed = event_json("c-21", p, 1999, "cus_c21");
        auto file = write_file("fixed.json", fixed + "\n");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(argv(invalid_id, "--event", file))) == 0,
                           c->out() + c->err());
        BOOST_TEST(c->out().find("letter " + invalid_id +
                                 ": replayed with the corrected event to topic billing by alice") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 1 --event fixed.json --by alice "
                                    "--nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 5u; }, seconds(40)),
                           consumer.err());
        BOOST_TEST(charges_for(*fake, key_of("c-21", p)).first.size() == 1u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "show", invalid_id, "--pg-dsn", dsn())) ==
                           0);
        BOOST_TEST(c->out().find("corrected event published by the replay") != std::string::npos, c->out());
        BOOST_TEST(c->out().find(fixed) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("19.99") != std::string::npos, c->out());  // the original is kept too
        // A corrected event that is itself invalid is refused.
        auto bad = write_file("bad.json", R"({"customer_id":"x"})");
        BOOST_TEST(co_await run_cmd(c, replay(argv(smoke_id, "--event", bad))) == 1);
        BOOST_TEST(c->out().find("the corrected event is not a valid billing event") != std::string::npos,
                   c->out());

        // The rest are dismissed with a reason; a dismissed letter is not replayed.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", conflict_id, smoke_id,
                                                    "--reason", "2500 was a publisher bug; smoke test",
                                                    "--by", "bob", "--pg-dsn", dsn())) == 0,
                           c->err());
        BOOST_TEST(c->out().find("2 dismissed, 0 not open, 0 failed") != std::string::npos, c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard dead-letters dismiss 2 3 --reason '2500 was a publisher bug; smoke "
                             "test' --by bob",
                             c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "dismiss", smoke_id, "--reason", "again",
                                            "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("not open (dismissed by bob)") != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, replay(argv(conflict_id))) == 0);
        BOOST_TEST(c->out().find("dismissed by bob") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 5u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "list", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("0 letter(s) open") != std::string::npos, c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters list", c->out()) == "");
        auto letters = co_await query("SELECT count(*) FROM dead_letters");
        BOOST_TEST(letters.text(0, 0) == "4");  // no refusal made a new letter
        co_await stop_cleanly(consumer);

        // A consume started now exports every class at 0 and the dismissals.
        auto& next = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return (port = next.logged_port()).has_value(); }, seconds(20)));
        for (int i = 0; i < 400; ++i) {
            metrics = co_await scrape(*port);
            if (scraped(metrics, "chargeguard_dead_letters_dismissed") == 3) break;
            co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_dismissed") == 3, metrics);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 0);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"conflict\"}") == 0);
        co_await stop_cleanly(next);

        // explain on an event whose only letter was dismissed: not "never seen".
        auto gone = co_await add_letter(event_json("x-gone", p, 700, "cus_g"), "stripe rejected: test");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", std::to_string(gone),
                                                    "--reason", "cancelled order", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--customer", "x-gone", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn(), "--json")) == 2,
            c->err());
        auto closed = parse_explained(c->out());
        BOOST_TEST(closed.state == "dead_lettered");
        BOOST_TEST(closed.verdict.rfind("dead-lettered: stripe rejected: test (letter " +
                                            std::to_string(gone) + " dismissed at ",
                                        0) == 0u,
                   closed.verdict);
    });
}
