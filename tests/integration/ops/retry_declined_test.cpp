// ops_e2e: `retry-declined` — a declined key charged once after the card is fixed, two retries at once and a
// re-publication, a crash mid-retry.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// The first incident: a customer's card is declined; re-publishing the event changes nothing (the
// row is final). Once the card is fixed, `retry-declined` — by customer and period, by key, and for every
// declined row of a period — charges each key exactly once under a new key generation, records who and why,
// and `explain` shows each attempt. A retry while the card is still declined is declined again (a second
// generation), and the next retry still charges once. A PaymentIntent left requires_action (3-D Secure on
// session) is cancelled first, so it can never succeed beside the retry's payment.
BOOST_FIXTURE_TEST_CASE(retry_declined_charges_once_after_the_card_is_fixed, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-07";
        fake::decline_rule auth;
        auth.code = "authentication_required";
        for (const char* cus : {"cus_d1", "cus_d2", "cus_d3"}) fake->decline(cus);
        fake->decline("cus_d4", auth);
        nsqd->publish(topic, event_json("d1", p, 1100, "cus_d1"));
        nsqd->publish(topic, event_json("d2", p, 1200, "cus_d2"));
        nsqd->publish(topic, event_json("d3", p, 1300, "cus_d3"));
        nsqd->publish(topic, intent_event("d4", p, 1400, "cus_d4"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        auto status_count = [&](const std::string& status) -> net::awaitable<std::int64_t> {
            auto r = co_await query("SELECT count(*) FROM billing_records WHERE billing_period = '" + p +
                                    "' AND status = '" + status + "'");
            co_return r.get<std::int64_t>(0, 0);
        };
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 4u; }, seconds(40)),
                           consumer.err());
        BOOST_TEST_REQUIRE(co_await status_count("declined") == 4);
        BOOST_TEST_REQUIRE(fake->intents().size() == 1u);
        BOOST_TEST(fake->intents()[0].status == "requires_action");
        // Declines are logged at warn: someone should look.
        BOOST_TEST(consumer.err().find("\"level\":\"warn\",\"msg\":\"billing message finished\"") !=
                       std::string::npos,
                   consumer.err());

        // Re-publishing the event is finished as a duplicate: no new charge.
        nsqd->publish(topic, event_json("d1", p, 1100, "cus_d1"));
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == 5u; }, seconds(20)));
        BOOST_TEST(charges_for(*fake, key_of("d1", p)).second == 1u);

        auto retry = [&](std::vector<std::string> how) {
            auto a = argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                          "--by", "alice", "--reason", "card updated");
            a.insert(a.end(), how.begin(), how.end());
            auto s = stripe_args();
            a.insert(a.end(), s.begin(), s.end());
            return a;
        };
        child* c = nullptr;
        const std::string explain_d1 = "chargeguard explain --customer d1 --period 2026-07";
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "d1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 2,
            c->err());
        BOOST_TEST(runbook_mismatch(explain_d1, c->out(), 0) == "");
        // Still declined: the retry charges under generation 2 and is declined again.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("retry #1 by alice: reopened under generation 2") != std::string::npos,
                   c->out());
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return charges_for(*fake, key_of("d1", p)).second == 2u; }, seconds(20)));
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == 6u; }, seconds(20)));
        BOOST_TEST(co_await status_count("declined") == 4);

        // The customers fix their cards.
        for (const char* cus : {"cus_d1", "cus_d2", "cus_d3", "cus_d4"}) fake->clear_decline(cus);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("reopened under generation 3") != std::string::npos, c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard retry-declined --customer d1 --period 2026-07 --reason 'card "
                             "updated' --by alice --nsqd-tcp-address nsqd:4150",
                             c->out()) == "");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--key", key_of("d2", p)))) == 0, c->err());
        BOOST_TEST(c->out().find("reopened under generation 2") != std::string::npos, c->out());
        // Every row still declined in the period: d3, and d4 whose open intent is cancelled first.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--period", p, "--all"))) == 0, c->err());
        BOOST_TEST(c->out().find("was requires_action: cancelled") != std::string::npos, c->out());
        BOOST_TEST(
            c->out().find("2 retried, 0 charged already, 0 not declined, 0 failed") != std::string::npos,
            c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard retry-declined --period 2026-07 --all --reason 'card updated' "
                             "--by alice --nsqd-tcp-address nsqd:4150",
                             c->out()) == "");
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 10u; },
                                seconds(40)),
            consumer.err());
        BOOST_TEST(co_await status_count("charged") == 4);
        for (const char* who : {"d1", "d2", "d3", "d4"}) {
            BOOST_TEST_CONTEXT(who) {
                auto key = key_of(who, p);
                auto [ok, all] = charges_for(*fake, key);
                BOOST_TEST_REQUIRE(ok.size() == 1u);
                auto row = co_await query(
                    "SELECT charge_id, key_generation FROM billing_records WHERE key = '" + key + "'");
                BOOST_TEST(row.text(0, 0) == ok[0]);
                BOOST_TEST(row.text(0, 1) == (std::string(who) == "d1" ? "3" : "2"));
                BOOST_TEST(all == (std::string(who) == "d1" ? 3u : std::string(who) == "d4" ? 1u : 2u));
            }
        }
        BOOST_TEST_REQUIRE(fake->intents().size() == 2u);
        BOOST_TEST(fake->intents()[0].status == "canceled");
        BOOST_TEST(fake->intents()[1].status == "succeeded");
        auto recorded = co_await query(
            "SELECT count(*), count(*) FILTER (WHERE requested_by = 'alice' AND reason = 'card updated') "
            "FROM billing_retries");
        BOOST_TEST(recorded.text(0, 0) == "5");
        BOOST_TEST(recorded.text(0, 1) == "5");

        // A retry of a charged key charges nothing.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("charged (ch_") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 10u);

        // explain: each attempt and how it ended.
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "d1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 0,
            c->err());
        const auto& out = c->out();
        BOOST_TEST(out.find("attempts:     3 (retried after a decline)") != std::string::npos, out);
        BOOST_TEST(out.find("attempt 1 (generation 1): first delivery -> declined: ") != std::string::npos,
                   out);
        BOOST_TEST(out.find("attempt 2 (generation 2): retry #1 by alice at ") != std::string::npos, out);
        BOOST_TEST(out.find("attempt 3 (generation 3): retry #2 by alice at ") != std::string::npos, out);
        BOOST_TEST(out.find(": card updated -> charged (charge " +
                            charges_for(*fake, key_of("d1", p)).first[0]) != std::string::npos,
                   out);
        BOOST_TEST(out.find("verdict: charged once: ") != std::string::npos, out);
        BOOST_TEST(out.find("3 attempts (2 retried after a decline)") != std::string::npos, out);
        BOOST_TEST(runbook_mismatch(explain_d1, out, 1) == "");
        co_await stop_cleanly(consumer);
    });
}

// Two retries of one declined key at once, racing a re-publication of the original event: one retry
// reopens the row (one billing_retries record), every delivery goes through the ledger's lease, and Stripe
// holds exactly one succeeded charge for the key.
BOOST_FIXTURE_TEST_CASE(two_retries_at_once_and_a_republication_charge_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-06", body = event_json("r1", p, 2100, "cus_r1");
        fake->decline("cus_r1");
        nsqd->publish(topic, body);
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        fake->clear_decline("cus_r1");
        auto retry = [&](const char* by) {
            return argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                        "--by", by, "--reason", "card updated", "--customer", "r1", "--period", p);
        };
        auto& a = spawn(retry("alice"));
        auto& b = spawn(retry("bob"));
        nsqd->publish(topic, body);
        BOOST_TEST(co_await wait_exit(a, seconds(30)) == 0, a.err());
        BOOST_TEST(co_await wait_exit(b, seconds(30)) == 0, b.err());
        auto key = key_of("r1", p);
        auto charged = [&]() -> net::awaitable<bool> {
            auto r = co_await query("SELECT status FROM billing_records WHERE key = '" + key + "'");
            co_return r.text(0, 0) == "charged";
        };
        for (int i = 0; i < 400 && !co_await charged(); ++i) co_await net::sleep_for(milliseconds(50));
        BOOST_TEST_REQUIRE(co_await charged(), consumer.err());
        // Every message published (the original, the re-publication, one or two retries) is finished.
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == nsqd->topic_message_count(topic); },
            seconds(30)));
        co_await stop_cleanly(consumer);
        auto [ok, all] = charges_for(*fake, key);
        BOOST_TEST(ok.size() == 1u);
        BOOST_TEST(all == 2u);  // the decline and the one success
        auto recorded = co_await query("SELECT count(*) FROM billing_retries WHERE key = '" + key + "'");
        BOOST_TEST(recorded.text(0, 0) == "1");
        auto outs = a.out() + b.out();
        BOOST_TEST(outs.find("reopened under generation 2") != std::string::npos, outs);
    });
}

// A crash in the middle of a retry: the new generation's call is left without an answer (indeterminate)
// while Stripe holds only the old generation's fresh decline. The redelivery searches and must not read
// that decline as the new generation's answer (its id is recorded with the retry): it finds nothing, takes
// a new generation once the old call is quiet, and charges once. Then `consume` is killed while the charge
// of another retried key is inside Stripe, and the restarted consume still charges that key once.
BOOST_FIXTURE_TEST_CASE(a_crash_mid_retry_still_charges_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        // nsqd requeues a killed consumer's messages at once (as it does once their timeout passes).
        test::nsq::fake_nsqd_options o;
        o.requeue_on_disconnect = true;
        start_nsqd(o);
        co_await migrate();
        const std::string p = "2026-05";
        fake->decline("cus_k1");
        fake->decline("cus_k2");
        nsqd->publish(topic, event_json("k1", p, 3100, "cus_k1"));
        nsqd->publish(topic, event_json("k2", p, 3200, "cus_k2"));
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 2u; },
                                    seconds(40)),
                consumer.err());
            co_await stop_cleanly(consumer);
        }
        fake->clear_decline("cus_k1");
        fake->clear_decline("cus_k2");
        auto retry = [&](const char* customer) {
            return argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                        "--reason", "card updated", "--customer", customer, "--period", p);
        };
        auto k1 = key_of("k1", p), k2 = key_of("k2", p);
        auto charged = [&](const std::string& key) -> net::awaitable<bool> {
            auto r = co_await query("SELECT status FROM billing_records WHERE key = '" + key + "'");
            co_return r.text(0, 0) == "charged";
        };

        // k1: the retry's generation-2 call "was sent and never answered" (the row says so) and Stripe made
        // nothing: the search sees only the decline of moments ago.
        child* c = nullptr;
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k1")) == 0, c->err());
        co_await query(
            "UPDATE billing_records SET indeterminate_since = now(), stripe_attempts = stripe_attempts + 1 "
            "WHERE key = '" +
            k1 + "'");
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            for (int i = 0; i < 400 && !co_await charged(k1); ++i) co_await net::sleep_for(milliseconds(50));
            BOOST_TEST_REQUIRE(co_await charged(k1), consumer.err());
            co_await stop_cleanly(consumer);
        }
        auto gen = co_await query("SELECT key_generation FROM billing_records WHERE key = '" + k1 + "'");
        BOOST_TEST(gen.text(0, 0) == "3");  // a new generation once the search found nothing of generation 2

        // k2: consume is killed while the retry's charge is inside Stripe; the restarted consume finishes it.
        // The retry is run twice, as after a crash of the command between its reopen and its publish: the
        // second run finds the row reopened by the first and publishes the event again.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k2")) == 0, c->err());
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k2")) == 0, c->err());
        BOOST_TEST(c->out().find("retry #2 by ") != std::string::npos, c->out());
        BOOST_TEST(
            c->out().find("is under way (generation 2): published again; event published to billing") !=
                std::string::npos,
            c->out());
        fake->faults().stall_ms = 3000;
        fake->faults().stall_count = 1;
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            BOOST_TEST_REQUIRE(co_await eventually([&] { return !fake->fault_hits().empty(); }, seconds(20)),
                               consumer.err());
            ::kill(consumer.pid, SIGKILL);
            co_await wait_exit(consumer, seconds(10));
        }
        auto& again = spawn_consume(nsqd->tcp_address());
        for (int i = 0; i < 600 && !co_await charged(k2); ++i) co_await net::sleep_for(milliseconds(50));
        BOOST_TEST_REQUIRE(co_await charged(k2), again.err());
        co_await stop_cleanly(again);
        for (const auto& key : {k1, k2}) {
            BOOST_TEST_CONTEXT(key) {
                auto [ok, all] = charges_for(*fake, key);
                BOOST_TEST_REQUIRE(ok.size() == 1u);
                BOOST_TEST(all == 2u);  // the decline and the one success
                auto row = co_await query("SELECT charge_id FROM billing_records WHERE key = '" + key + "'");
                BOOST_TEST(row.text(0, 0) == ok[0]);
            }
        }
    });
}
