// ops_e2e: `reconcile` — a lost tenth of a run found and re-published, each tampered row classified, each
// connected account matched apart.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// The issue's scenario: only 90 % of a 120-customer run reaches NSQ; consume charges those; one charged row
// is set back to pending as if a crash lost the answer. reconcile finds 12 missing and settles the pending
// row from Stripe (the recovery search); --publish re-publishes the 12; consume charges them; every customer
// is charged exactly once and a last reconcile exits 0, reading Stripe in two pages and nothing else.
BOOST_FIXTURE_TEST_CASE(reconcile_publish_recovers_a_lost_tenth, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string period = "2026-11";
        std::string expected;
        std::set<std::string> keys;
        for (int i = 0; i < 120; ++i) {
            auto body = event_json("cust-" + std::to_string(i), period, 1000 + i);
            expected += body + "\n";
            keys.insert(key_of("cust-" + std::to_string(i), period));
            if (i % 10 != 7) nsqd->publish(topic, body);  // 108 published, 12 lost
        }
        auto file = write_file("run.jsonl", expected);
        // The consumer's backfill lists the account's charges soon after it starts, at a moment that
        // depends on the machine's speed; off here, so that the fake's request count below is reconcile's.
        auto& consumer = spawn_consume(nsqd->tcp_address(), {"--backfill-window", "0"});
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 108u; },
                                seconds(60)),
            consumer.err());
        // A crash between Stripe's answer and the ledger write: charged at Stripe, pending in the ledger.
        const std::string crashed = key_of("cust-3", period);
        auto before = co_await query("SELECT charge_id FROM billing_records WHERE key = '" + crashed + "'");
        std::string charge_id(before.text(0, 0));
        co_await query(
            "UPDATE billing_records SET status = 'pending', charge_id = NULL, stripe_attempts = 1, "
            "first_stripe_attempt_at = now(), lease_until = now() - interval '1 second' WHERE key = '" +
            crashed + "'");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, period)) == 2, c->err());
        auto first = parse_report(c->out());
        BOOST_TEST(first.classes["missing"] == 12);
        BOOST_TEST(first.classes["ok"] == 108);
        BOOST_TEST(first.classes["pending"] == 0);
        BOOST_TEST(first.unexplained == 12);
        BOOST_TEST(first.republished == 0);
        BOOST_TEST(first.class_of["cust-7"] == "missing");
        BOOST_TEST(first.action_of["cust-3"] == "settled charged " + charge_id, first.action_of["cust-3"]);
        auto settled =
            co_await query("SELECT status, charge_id FROM billing_records WHERE key = '" + crashed + "'");
        BOOST_TEST(settled.text(0, 0) == "charged");
        BOOST_TEST(settled.text(0, 1) == charge_id);
        BOOST_TEST(nsqd->topic_message_count(topic) == 108u);  // without --publish nothing is published

        auto args = reconcile_args(file, period);
        for (const char* a : {"--publish", "--nsqd-tcp-address"}) args.push_back(a);
        args.push_back(nsqd->tcp_address());
        args.push_back("--topic");
        args.push_back(topic);
        BOOST_TEST(co_await run_cmd(c, args) == 2,
                   c->err());  // re-published, not yet charged: still unexplained
        auto second = parse_report(c->out());
        BOOST_TEST(second.republished == 12);
        BOOST_TEST(second.action_of["cust-17"] == "re-published to " + topic);
        BOOST_TEST(nsqd->topic_message_count(topic) == 120u);

        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 120u; },
                                seconds(60)),
            consumer.err());
        co_await expect_charged_once(keys);

        auto before_requests = fake->requests();
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, period)) == 0, c->out() + c->err());
        auto last = parse_report(c->out());
        BOOST_TEST(last.classes["ok"] == 120);
        BOOST_TEST(last.unexplained == 0);
        // 120 charges, 100 a page: two list requests, no per-charge retrieve.
        BOOST_TEST(last.stripe_requests == 2);
        BOOST_TEST(fake->requests() - before_requests == 2u);
        co_await stop_cleanly(consumer);
    });
}

// One row tampered into each class, from a CSV run: ok, missing, pending (no charge anywhere), charged but
// absent at Stripe, at Stripe but not in the ledger, amount mismatch, declined, dead-lettered, cap_blocked.
BOOST_FIXTURE_TEST_CASE(reconcile_classifies_each_tampered_row, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string p = "2026-12";
        std::string csv = "customer_id,billing_period,amount_cents,currency,stripe_customer_id\n";
        for (int i = 0; i < 9; ++i) {
            auto amount = i == 5 ? 9999 : 1000 + i;  // c5: the run now says 9999; 1005 was charged
            csv += "c" + std::to_string(i) + "," + p + "," + std::to_string(amount) + ",usd,cus_" +
                   std::to_string(i) + "\n";
        }
        auto file = write_file("run.csv", csv);
        fake->decline("cus_6");
        for (int i : {0, 3, 4, 5, 6})
            nsqd->publish(topic,
                          event_json("c" + std::to_string(i), p, 1000 + i, "cus_" + std::to_string(i)));
        nsqd->publish(topic, event_json("c7", p, 0, "cus_7"));  // invalid amount: dead-lettered
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 6u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        co_await query("UPDATE billing_records SET charge_id = 'ch_gone' WHERE key = '" + key_of("c3", p) +
                       "'");
        co_await query("DELETE FROM billing_records WHERE key = '" + key_of("c4", p) + "'");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, lease_until) VALUES ('" +
            key_of("c2", p) + "', 'c2', '" + p +
            "', 1002, 'usd', 'cus_2', 'pending', now() - interval '1 minute')");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, last_error) VALUES ('" +
            key_of("c8", p) + "', 'c8', '" + p +
            "', 1008, 'usd', 'cus_8', 'cap_blocked', 'spend cap exceeded')");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, p)) == 2, c->err());
        auto r = parse_report(c->out());
        const std::map<std::string, std::string> want = {
            {"c0", "ok"},
            {"c1", "missing"},
            {"c2", "pending"},
            {"c3", "charged_absent_at_stripe"},
            {"c4", "at_stripe_not_in_ledger"},
            {"c5", "amount_currency_mismatch"},
            {"c6", "declined"},
            {"c7", "dead_lettered"},
            {"c8", "cap_blocked"},
        };
        for (const auto& [cust, cls] : want) BOOST_TEST(r.class_of[cust] == cls, cust + ": " + c->out());
        BOOST_TEST(r.class_of.size() == want.size());
        BOOST_TEST(r.unexplained == 5);  // missing, pending, absent, not in ledger, mismatch
        BOOST_TEST(r.action_of["c2"] == "no charge carries the key");

        // The table names the same classes for a human.
        auto args = reconcile_args(file, p);
        args.erase(std::find(args.begin(), args.end(), "--json"));
        BOOST_TEST(co_await run_cmd(c, args) == 2);
        BOOST_TEST(c->out().find("5 unexplained, 0 re-published") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("charge ch_gone does not exist at Stripe") != std::string::npos, c->out());
    });
}

// Stripe Connect: an entry of the run is a (customer, period, account). The same customer id on the platform
// and on two connected accounts is three entries, each matched with its own ledger row and its own charge,
// listed in its account (Stripe-Account). A run's event never published in one account is missing there
// (while the platform's is ok); a charge whose ledger row was lost in another account is reported there; an
// event charged in another account than the run's is missing in the run's and unexpected in the other.
BOOST_FIXTURE_TEST_CASE(reconcile_matches_each_connected_account_apart, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string p = "2026-10", a = "acct_1ReconA", b = "acct_1ReconB";
        fake->add_account(a, {"cus_ops"});
        fake->add_account(b, {"cus_ops"});
        auto body = [&](const std::string& customer, std::int64_t amount, const std::string& account) {
            auto e = event_json(customer, p, amount);
            if (account.empty()) return e;
            e.pop_back();
            return e + R"(,"stripe_account":")" + account + "\"}";
        };
        struct entry {
            std::string customer;
            std::int64_t amount;
            std::string account;
        };
        const std::vector<entry> run_events = {
            {"shop-1", 1100, ""}, {"shop-1", 1101, a},  {"shop-1", 1102, b}, {"shop-2", 1200, a},
            {"shop-2", 1201, b},  {"shop-3", 1300, ""}, {"shop-3", 1301, a}, {"shop-4", 1400, a}};
        std::string expected;
        for (const auto& e : run_events) expected += body(e.customer, e.amount, e.account) + "\n";
        auto file = write_file("connect.jsonl", expected);
        // Published: all but shop-3's on a, and shop-4's on b instead of a.
        for (const auto& e : run_events) {
            if (e.customer == "shop-3" && e.account == a) continue;
            nsqd->publish(topic, body(e.customer, e.amount, e.customer == "shop-4" ? b : e.account));
        }
        // No backfill: it would restore the row deleted below.
        auto& consumer = spawn_consume(nsqd->tcp_address(), {"--backfill-window", "0"});
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 7u; }, seconds(60)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        std::size_t in_b = 0;
        for (const auto& ch : fake->charges()) in_b += ch.account == b;
        BOOST_TEST(fake->charges().size() == 7u);
        BOOST_TEST(in_b == 3u);
        // shop-2's row on b lost: its charge is one the ledger does not account for, in b only.
        co_await query("DELETE FROM billing_records WHERE key = '" +
                       billing::base_key(key_namespace, "shop-2", p, b) + "'");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, p)) == 2, c->err());
        auto got = classes_by_account(c->out());
        const std::map<std::string, std::string> want = {
            {"shop-1@-", "ok"},
            {"shop-1@" + a, "ok"},
            {"shop-1@" + b, "ok"},
            {"shop-2@" + a, "ok"},
            {"shop-2@" + b, "at_stripe_not_in_ledger"},
            {"shop-3@-", "ok"},
            {"shop-3@" + a, "missing"},
            {"shop-4@" + a, "missing"},
            {"shop-4@" + b, "amount_currency_mismatch"},  // charged; the run does not list it there
        };
        for (const auto& [who, cls] : want) BOOST_TEST(got[who] == cls, who + ": " + c->out());
        BOOST_TEST(got.size() == want.size(), c->out());
        BOOST_TEST(parse_report(c->out()).unexplained == 4);
    });
}
