// ops_e2e: `explain` — every ledger state, a corrected period's revisions and their Stripe objects, the rest
// of the verdict table (docs/operating/cli.md) and --stripe-customer.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// `chargeguard explain` for every ledger state: a row charged by `consume` itself, rows written as the
// pipeline leaves them (pending with a live lease, pending indeterminate, declined, cap-blocked), a key with
// only a dead letter, and a key never seen. Each answers with its state, its one-line verdict and exit 0
// (charged) or 2; --stripe finds the charge by the recovery search, also when the ledger lost the answer.
BOOST_FIXTURE_TEST_CASE(explain_answers_for_every_ledger_state, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-08";
        nsqd->publish(topic, event_json("x-charged", p, 1200, "cus_x"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        // The pipeline's log lines name the customer and period next to the key.
        auto logged = consumer.err();
        BOOST_TEST(logged.find("\"billing_key\":\"" + key_of("x-charged", p) + "\"") != std::string::npos,
                   logged);
        BOOST_TEST(logged.find("\"customer_id\":\"x-charged\"") != std::string::npos, logged);
        BOOST_TEST(logged.find("\"period\":\"" + p + "\"") != std::string::npos, logged);
        auto insert = [&](const std::string& customer, const std::string& cols, const std::string& values) {
            return query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id" +
                cols + ") VALUES ('" + key_of(customer, p) + "', '" + customer + "', '" + p +
                "', 1300, 'usd', 'cus_y'" + values + ")");
        };
        co_await insert("x-live",
                        ", status, lease_until, lease_epoch, stripe_attempts, first_stripe_attempt_at",
                        ", 'pending', now() + interval '10 minutes', 7, 1, now()");
        co_await insert(
            "x-indet", ", status, lease_until, indeterminate_since, stripe_attempts, first_stripe_attempt_at",
            ", 'pending', now() - interval '1 minute', now() - interval '5 minutes', 1, "
            "now() - interval '5 minutes'");
        co_await insert("x-declined", ", status, last_error",
                        ", 'declined', 'card_declined: insufficient funds'");
        co_await insert("x-cap", ", status, last_error", ", 'cap_blocked', 'spend cap exceeded'");
        co_await query(
            "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, "
            "billing_key) "
            "VALUES ('" +
            topic + "', '" + channel + "', '0a1b2c3d4e5f6073', 5, convert_to('{}', 'UTF8'), " +
            "'stripe rejected: No such customer', '" + key_of("x-dead", p) + "')");

        // The vault released x-cap's reservation when it refused the charge (a later generation's key too).
        co_await query(
            "INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency) VALUES "
            "('vk_explain', 'explain', decode(repeat('00', 32), 'hex'), '" +
            p + "', 100, 'usd')");
        co_await query(
            "INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state) VALUES "
            "('vk_explain', '" +
            key_of("x-cap", p) + "', 1300, 'released'), ('vk_explain', '" + key_of("x-cap", p) +
            "-g2', 1300, 'reserved')");
        auto explain = [&](const std::string& customer, std::vector<std::string> extra = {}) {
            auto a = argv("explain", "--customer", customer, "--period", p, "--key-namespace", key_namespace,
                          "--pg-dsn", dsn(), "--json");
            a.insert(a.end(), extra.begin(), extra.end());
            return a;
        };
        struct want {
            std::string customer, state, verdict_prefix;
            int code;
        };
        const std::vector<want> table = {
            {"x-charged", "charged", "charged once: ch_", 0},
            {"x-live", "pending", "pending: lease held (epoch 7) until ", 2},
            {"x-indet", "pending", "pending, indeterminate since ", 2},
            {"x-declined", "declined", "declined: card_declined: insufficient funds", 2},
            {"x-cap", "cap_blocked", "cap-blocked: spend cap exceeded", 2},
            {"x-dead", "dead_lettered",
             "dead-lettered: stripe rejected: No such customer; replay with chargeguard "
             "dead-letters replay ",
             2},
            {"x-unknown", "never_seen", "never seen: ", 2},
        };
        child* c = nullptr;
        std::string charged_id;
        for (const auto& w : table) {
            BOOST_TEST_CONTEXT(w.customer) {
                BOOST_TEST(co_await run_cmd(c, explain(w.customer)) == w.code, c->err());
                auto x = parse_explained(c->out());
                BOOST_TEST(x.state == w.state);
                BOOST_TEST(x.verdict.rfind(w.verdict_prefix, 0) == 0u, x.verdict);
                if (w.state == "charged") charged_id = x.ledger_charge;
                if (w.customer == "x-cap")
                    BOOST_TEST((x.spend_states == std::vector<std::string>{"released", "reserved"}));
                else
                    BOOST_TEST(x.spend_states.empty());
            }
        }
        BOOST_TEST_REQUIRE(charges_by_key()[key_of("x-charged", p)].size() == 1u);
        BOOST_TEST(charged_id == charges_by_key()[key_of("x-charged", p)].front());

        // The text form ends with the verdict line; --key finds the same row.
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--key", key_of("x-charged", p), "--pg-dsn", dsn())) == 0,
            c->err());
        BOOST_TEST(c->out().find("verdict: charged once: " + charged_id) != std::string::npos, c->out());

        // --stripe: the recovery search finds the charge; with the ledger's answer lost (the row set back to
        // pending, as a crash after Stripe answered leaves it) it still does, and says recovery records it.
        auto s = stripe_args();
        s.insert(s.begin(), "--stripe");
        BOOST_TEST(co_await run_cmd(c, explain("x-charged", s)) == 0, c->err());
        BOOST_TEST(parse_explained(c->out()).stripe_charge == charged_id);
        co_await query(
            "UPDATE billing_records SET status = 'pending', charge_id = NULL, lease_until = now() - interval "
            "'1 minute', indeterminate_since = now() WHERE key = '" +
            key_of("x-charged", p) + "'");
        BOOST_TEST(co_await run_cmd(c, explain("x-charged", s)) == 2, c->err());
        auto lost = parse_explained(c->out());
        BOOST_TEST(lost.state == "pending");
        BOOST_TEST(lost.stripe_charge == charged_id);
        BOOST_TEST(lost.verdict.find("Stripe already holds " + charged_id) != std::string::npos,
                   lost.verdict);
        // A customer Stripe has nothing for: searched, nothing found.
        BOOST_TEST(co_await run_cmd(c, explain("x-declined", s)) == 2, c->err());
        BOOST_TEST(parse_explained(c->out()).stripe_charge.empty());
        BOOST_TEST(c->err().find(stripe_key) == std::string::npos);

        // Stripe Connect: a connected account's row is found by its own key (the account hashed in), with
        // --stripe-account; without it the platform's key names no row, and the customer and period alone do
        // not find another account's row.
        const std::string connect_key = billing::base_key(key_namespace, "x-conn", p, "acct_1Ops");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, stripe_account, status, last_error) VALUES ('" +
            connect_key + "', 'x-conn', '" + p +
            "', 1300, 'usd', 'cus_y', 'acct_1Ops', 'declined', 'card_declined')");
        const std::vector<std::string> for_account{"--stripe-account", "acct_1Ops"};
        BOOST_TEST(co_await run_cmd(c, explain("x-conn", for_account)) == 2, c->err());
        auto in_account = parse_explained(c->out());
        BOOST_TEST(in_account.state == "declined");
        BOOST_TEST(c->out().find(connect_key) != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, explain("x-conn")) == 2, c->err());
        BOOST_TEST(parse_explained(c->out()).state == "never_seen");
    });
}

// `explain` for a corrected period, from a ledger `consume` wrote: the original (1000, charged), revision 1
// (to 1500: a charge of 500) and revision 2 (to 700: refunds of 500 and 300, newest payment first). The
// JSON lists each revision with its total, difference and state and each money move with its Stripe
// object, and the money moved for the period; the verdict names the last total; the text shows the same,
// and a correction's key given to --key finds its period.
BOOST_FIXTURE_TEST_CASE(explain_shows_a_periods_corrections_and_their_stripe_objects, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-07";
        const auto base = key_of("x-corr", p);
        auto& consumer = spawn_consume(nsqd->tcp_address());
        const std::int64_t totals[] = {1000, 1500, 700};
        for (int rev = 0; rev < 3; ++rev) {
            auto body = event_json("x-corr", p, totals[rev], "cus_x");
            if (rev > 0) {
                body.pop_back();
                body += ",\"revision\":" + std::to_string(rev) + "}";
            }
            nsqd->publish(topic, body);
            auto want = static_cast<std::size_t>(rev + 1);
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == want; },
                                    seconds(40)),
                consumer.err());
        }
        co_await stop_cleanly(consumer);
        BOOST_TEST_REQUIRE(fake->charges().size() == 2u);
        BOOST_TEST_REQUIRE(fake->refunds().size() == 2u);
        const auto original = fake->charges()[0].id;
        const auto r1_charge = fake->charges()[1].id;
        const auto refund1 = fake->refunds()[0].id;
        const auto refund2 = fake->refunds()[1].id;

        child* c = nullptr;
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--customer", "x-corr", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn(), "--json")) == 0,
            c->err());
        simdjson::dom::parser parser;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(parser.parse(c->out()).get(doc) == simdjson::SUCCESS, c->out());
        auto text = [](simdjson::dom::element e, const char* k) {
            auto v = e[k];
            return v.is_null() ? std::string("null") : std::string(v.get_string().value());
        };
        BOOST_TEST(text(doc, "state") == "charged");
        BOOST_TEST(text(doc, "verdict")
                           .find("; corrected to 700 cents by revision 2 (applied); net moved 700 "
                                 "cents") != std::string::npos,
                   text(doc, "verdict"));
        BOOST_TEST(text(doc, "net_cents") == "700");
        simdjson::dom::array revs = doc["corrections"].get_array().value();
        BOOST_TEST_REQUIRE(revs.size() == 2u, c->out());
        simdjson::dom::element r1 = revs.at(0).value(), r2 = revs.at(1).value();
        BOOST_TEST(text(r1, "key") == base + "-r1");
        BOOST_TEST(text(r1, "revision") == "1");
        BOOST_TEST(text(r1, "total_cents") == "1500");
        BOOST_TEST(text(r1, "delta_cents") == "500");
        BOOST_TEST(text(r1, "status") == "applied");
        simdjson::dom::array m1 = r1["moves"].get_array().value();
        BOOST_TEST_REQUIRE(m1.size() == 1u);
        BOOST_TEST(text(m1.at(0).value(), "kind") == "charge");
        BOOST_TEST(text(m1.at(0).value(), "amount_cents") == "500");
        BOOST_TEST(text(m1.at(0).value(), "status") == "done");
        BOOST_TEST(text(m1.at(0).value(), "stripe_object_id") == r1_charge);
        BOOST_TEST(text(r2, "total_cents") == "700");
        BOOST_TEST(text(r2, "delta_cents") == "-800");
        BOOST_TEST(text(r2, "status") == "applied");
        simdjson::dom::array m2 = r2["moves"].get_array().value();
        BOOST_TEST_REQUIRE(m2.size() == 2u);
        BOOST_TEST(text(m2.at(0).value(), "kind") == "refund");
        BOOST_TEST(text(m2.at(0).value(), "refund_of") == r1_charge);
        BOOST_TEST(text(m2.at(0).value(), "amount_cents") == "500");
        BOOST_TEST(text(m2.at(0).value(), "stripe_object_id") == refund1);
        BOOST_TEST(text(m2.at(1).value(), "refund_of") == original);
        BOOST_TEST(text(m2.at(1).value(), "amount_cents") == "300");
        BOOST_TEST(text(m2.at(1).value(), "stripe_object_id") == refund2);

        // The text, asked by a correction's key as the logs print it.
        BOOST_TEST(co_await run_cmd(c, argv("explain", "--key", base + "-r2", "--pg-dsn", dsn())) == 0,
                   c->err());
        const auto& out = c->out();
        BOOST_TEST(
            out.find("corrections:  2 revision(s); net moved for the period: 700 cents") != std::string::npos,
            out);
        BOOST_TEST(out.find("revision 2 (" + base + "-r2): total 700 usd, difference -800, applied") !=
                       std::string::npos,
                   out);
        BOOST_TEST(out.find("  move 1: charge 500 cents, done, stripe " + r1_charge) != std::string::npos,
                   out);
        BOOST_TEST(out.find("  move 2: refund of " + original + " 300 cents, done, stripe " + refund2) !=
                       std::string::npos,
                   out);
    });
}

// explain's verdict table (docs/operating/cli.md), the rows explain_answers_for_every_ledger_state leaves
// out: processing, failed after processing, pending with its lease expired, failed and conflict without an
// open letter; and --stripe-customer on the second incident — one Stripe customer billed under
// `C-05` and `c-05` is charged twice, which per key looks like two single charges.
BOOST_FIXTURE_TEST_CASE(explain_verdicts_by_table_and_by_stripe_customer, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-03";
        nsqd->publish(topic, event_json("C-05", p, 900, "cus_05"));
        nsqd->publish(topic, event_json("c-05", p, 900, "cus_05"));
        nsqd->publish(topic, event_json("c-06", p, 900, "cus_06"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 3u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        auto insert = [&](const std::string& customer, const std::string& cols, const std::string& values) {
            return query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status" +
                cols + ") VALUES ('" + key_of(customer, p) + "', '" + customer + "', '" + p +
                "', 1300, 'usd', 'cus_t'" + values + ")");
        };
        co_await insert(
            "t-processing",
            ", charge_id, stripe_status, stripe_status_at, processing_since, raw_body, nsq_topic, "
            "nsq_channel",
            ", 'processing', 'py_t1', 'processing', now(), now(), '\\x7b7d', 'billing', 'chargeguard'");
        co_await insert("t-late", ", last_error", ", 'failed_after_processing', 'insufficient_funds'");
        co_await insert("t-expired", ", lease_until, stripe_attempts, first_stripe_attempt_at",
                        ", 'pending', now() - interval '1 minute', 1, now()");
        co_await insert("t-failed", ", last_error", ", 'failed', 'No such customer'");
        co_await insert("t-conflict", ", last_error", ", 'conflict', 'Keys for idempotent requests'");
        struct want {
            std::string customer, state, verdict_prefix;
        };
        const std::vector<want> table = {
            {"t-processing", "processing", "processing since "},
            {"t-late", "failed_after_processing", "failed after processing: insufficient_funds"},
            {"t-expired", "pending", "pending: lease expired; the next delivery resumes it"},
            {"t-failed", "failed", "failed: No such customer"},
            {"t-conflict", "conflict", "conflict: Keys for idempotent requests"},
            {"c-05", "charged", "charged once: ch_"},
        };
        child* c = nullptr;
        for (const auto& w : table) {
            BOOST_TEST_CONTEXT(w.customer) {
                BOOST_TEST(co_await run_cmd(c, argv("explain", "--customer", w.customer, "--period", p,
                                                    "--key-namespace", key_namespace, "--pg-dsn", dsn(),
                                                    "--json")) == (w.state == "charged" ? 0 : 2),
                           c->err());
                auto x = parse_explained(c->out());
                BOOST_TEST(x.state == w.state);
                BOOST_TEST(x.verdict.rfind(w.verdict_prefix, 0) == 0u, x.verdict);
            }
        }
        auto by_cus = [&](const std::string& cus, bool stripe) {
            auto a = argv("explain", "--stripe-customer", cus, "--period", p, "--pg-dsn", dsn());
            if (stripe) {
                a.push_back("--stripe");
                auto s = stripe_args();
                a.insert(a.end(), s.begin(), s.end());
            }
            return a;
        };
        auto c05 = charges_for(*fake, key_of("C-05", p)).first,
             c05b = charges_for(*fake, key_of("c-05", p)).first;
        BOOST_TEST_REQUIRE(c05.size() == 1u);
        BOOST_TEST_REQUIRE(c05b.size() == 1u);
        // Each key alone is charged once.
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "c-05", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 0,
            c->err());
        BOOST_TEST(runbook_mismatch("chargeguard explain --customer c-05 --period 2026-03", c->out()) == "");
        // The double charge, from Stripe and from the ledger alone: one verdict line.
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_05", true)) == 2, c->err());
        BOOST_TEST(c->out().find("verdict: charged twice: Stripe holds 2 payments of cus_05 for period " + p +
                                 " under 2 customer id(s) (") != std::string::npos,
                   c->out());
        BOOST_TEST(c->out().find("C-05: " + c05[0]) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("c-05: " + c05b[0]) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("  ledger " + key_of("C-05", p) + ": customer C-05, charged 900 usd") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(runbook_mismatch("chargeguard explain --stripe-customer cus_05 --period 2026-03 --stripe",
                                    c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_05", false)) == 2, c->err());
        BOOST_TEST(c->out().find("verdict: charged twice: the ledger records 2 payments of cus_05") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_06", true)) == 0, c->err());
        BOOST_TEST(c->out().find("verdict: charged once: Stripe holds ch_") != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_none", true)) == 2, c->err());
        BOOST_TEST(
            c->out().find("verdict: not charged: Stripe holds no payment of cus_none") != std::string::npos,
            c->out());
    });
}
