// The backfill (billing/heal/backfill.hpp) against real PostgreSQL and fake-stripe: a ledger row lost
// entirely (a failover lost its insert) comes back from its Stripe charge, marked recovered. g++ 12 -O2 false
// positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include "billing/heal/backfill.hpp"

#include <boost/test/unit_test.hpp>

#include "billing/heal/settlement_poller.hpp"
#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "metrics/registry.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::key_of;
using cg::test::reason;

namespace {

using fixture = test::billing_fixture;

billing::backfill_config config() {
    billing::backfill_config c;
    c.key_namespace = test::key_namespace;
    c.window = 1h;
    c.page_size = 2;  // several pages for a handful of charges
    c.topic = "billing";
    c.channel = "chargeguard";
    return c;
}

// A bank debit (fake-stripe's US bank account test method that stays processing until settled by hand).
std::string bank_event_json(const std::string& customer) {
    return R"({"customer_id":")" + customer +
           R"(","billing_period":"2026-11","amount_cents":2500,"currency":"usd","stripe_customer_id":"cus_ok",)"
           R"("description":"plan 2026-11","payment_method":"pm_usBankAccount_processing","off_session":true})";
}

// The fake's PaymentIntents, read on its executor (the test's io_context).
std::vector<fake::intent_rec> intents_of(fixture& f) {
    return f.run([](fake::fake_stripe* fk) -> net::awaitable<std::vector<fake::intent_rec>> {
        co_return fk->intents();
    }(f.fake.get()));
}

// The row left processing by the pipeline for a bank debit, then lost entirely (a failover lost its insert
// and its processing update); the bank holds the debit.
std::string lose_a_processing_row(fixture& f, billing::charge_flow& p, const std::string& customer,
                                  const std::string& message_id) {
    auto v = f.handle(p, delivery_of(bank_event_json(customer), message_id));
    BOOST_TEST_REQUIRE(reason(v) == "processing", v.detail);
    auto key = key_of(customer, "2026-11");
    BOOST_TEST_REQUIRE(
        f.run(f.query("DELETE FROM billing_records WHERE key = $1", pg::params(key))).has_value());
    BOOST_TEST_REQUIRE(!f.row(key).has_value());
    return key;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_backfill)

// The row is deleted after its charge succeeded (what a failover that lost the insert and the settle leaves):
// the backfill inserts it `charged` with the charge id, marked recovered; a second run and a late redelivery
// change nothing and POST nothing. A charge of another key namespace and a row that exists are left alone.
BOOST_AUTO_TEST_CASE(row_lost_after_its_charge_succeeded_comes_back) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("bf-1", "2026-11", 1999);
    auto key = key_of("bf-1", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "6a01"))) == "charged");
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("bf-2", "2026-11", 300), "6a02"))) == "charged");
    auto charge_id = f.row(key)->charge_id.value_or("");
    BOOST_TEST_REQUIRE(charge_id != "");
    // Another namespace's charge in the same account: not this sidecar's row to rebuild.
    auto other_ev = billing::parse_event(event_json("bf-3", "2026-11", 400));
    BOOST_TEST_REQUIRE(other_ev.has_value());
    auto other_key = billing::base_key("other", "bf-3", "2026-11");
    auto other = test::run_async(f.io, [&]() {
        return f.stripe->create_charge(billing::build_charge_request(*other_ev, other_key, 1));
    });
    BOOST_TEST_REQUIRE(other.charge_id != "");
    auto deleted = f.run(f.query("DELETE FROM billing_records WHERE key = $1", pg::params(key)));
    BOOST_TEST_REQUIRE(deleted.has_value());
    BOOST_TEST(!f.row(key).has_value());

    metrics::registry reg;
    billing::backfill b(config(), f.pg, *f.stripe, logger(), &reg);
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->listed == 3u);
    BOOST_TEST(rep->ours == 2u);
    BOOST_TEST(rep->inserted == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == charge_id);
    BOOST_TEST(rec->amount_cents == 1999);
    BOOST_TEST(rec->customer_id == "bf-1");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND recovered_at IS NOT NULL",
                        key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE recovered_at IS NOT NULL") == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1", other_key) == 0);

    auto again = f.run(b.run_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->inserted == 0u);
    auto posts = f.fake->posts_for(key);
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "6a01", 2))) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == posts);
    BOOST_TEST(f.fake->charges().size() == 3u);
}

// A bank debit still processing when its row was lost comes back `processing` (not charged: the bank has
// not answered), with its PaymentIntent, the delivery a later dead letter needs and generation 1; the poll
// then follows it to `charged`. Nothing is POSTed again: a redelivery is a prevented duplicate.
BOOST_AUTO_TEST_CASE(row_lost_while_its_bank_debit_was_processing_comes_back_processing) {
    fixture f;
    f.run([](fake::fake_stripe* fk) -> net::awaitable<bool> {
        fk->settle_after(std::chrono::hours(1));
        co_return true;
    }(f.fake.get()));
    auto p = f.make_pipeline();
    auto key = lose_a_processing_row(f, *p, "bf-ach-1", "6b01");
    auto intents = intents_of(f);
    BOOST_TEST_REQUIRE(intents.size() == 1u);
    BOOST_TEST_REQUIRE(intents[0].status == "processing");

    metrics::registry reg;
    billing::backfill b(config(), f.pg, *f.stripe, logger(), &reg);
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->inserted == 1u);
    BOOST_TEST(rep->processing == 1u);
    BOOST_TEST(rep->failed == 0u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "processing");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND payment_intent_id = $2", key,
                        intents[0].id) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND recovered_at IS NOT NULL "
                        "AND key_generation = 1 AND processing_since IS NOT NULL AND nsq_topic = 'billing' "
                        "AND nsq_channel = 'chargeguard' AND payment_method = 'pm_usBankAccount_processing' "
                        "AND convert_from(raw_body, 'UTF8')::jsonb = $2::jsonb",
                        key, bank_event_json("bf-ach-1")) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters") == 0);
    // A second run and a redelivery change nothing and POST nothing.
    auto again = f.run(b.run_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->inserted == 0u);
    auto posts = f.fake->posts_for(key);
    BOOST_TEST(reason(f.handle(*p, delivery_of(bank_event_json("bf-ach-1"), "6b01", 2))) ==
               "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == posts);

    // The bank answers; no webhook comes: the poll settles the row charged.
    BOOST_TEST_REQUIRE(f.run([](fake::fake_stripe* fk, std::string id) -> net::awaitable<bool> {
        co_return fk->settle(id, "succeeded");
    }(f.fake.get(), intents[0].id)));
    billing::poller_config pc;
    pc.poll_after = 0ms;
    billing::settlement_poller poller(pc, f.pg, *f.stripe, logger());
    auto polled = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(polled.has_value(), (polled ? "" : polled.err().describe()));
    BOOST_TEST(polled->settled == 1u);
    rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(intents_of(f).size() == 1u);
}

// A bank debit that failed after processing, whose row was lost, comes back failed_after_processing with
// one dead letter (the event as published, to the consumer's topic) and the alert's counter; replaying the
// letter charges again under the next key generation — one new PaymentIntent, so the customer is charged.
BOOST_AUTO_TEST_CASE(row_lost_after_its_bank_debit_failed_comes_back_dead_lettered_and_replays) {
    fixture f;
    f.run([](fake::fake_stripe* fk) -> net::awaitable<bool> {
        fk->settle_after(std::chrono::hours(1));
        co_return true;
    }(f.fake.get()));
    auto p = f.make_pipeline();
    auto key = lose_a_processing_row(f, *p, "bf-ach-2", "6c01");
    auto intents = intents_of(f);
    BOOST_TEST_REQUIRE(intents.size() == 1u);
    BOOST_TEST_REQUIRE(f.run([](fake::fake_stripe* fk, std::string id) -> net::awaitable<bool> {
        co_return fk->settle(id, "failed", "insufficient_funds");
    }(f.fake.get(), intents[0].id)));
    // A card decline of this namespace is not a bank debit: still not backfilled.
    f.run([](fake::fake_stripe* fk) -> net::awaitable<bool> {
        fk->decline("cus_declined");
        co_return true;
    }(f.fake.get()));
    auto declined_key = key_of("bf-card", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("bf-card", "2026-11", 700, "cus_declined"),
                                               "6c02"))) == "declined");
    BOOST_TEST_REQUIRE(
        f.run(f.query("DELETE FROM billing_records WHERE key = $1", pg::params(declined_key))).has_value());

    metrics::registry reg;
    billing::backfill b(config(), f.pg, *f.stripe, logger(), &reg);
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->inserted == 1u);
    BOOST_TEST(rep->failed == 1u);
    BOOST_TEST(rep->processing == 0u);
    BOOST_TEST(!f.row(declined_key).has_value());
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "failed_after_processing");
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE billing_key = $1 AND topic = 'billing' AND "
                        "reason LIKE 'failed after processing%insufficient_funds%' AND "
                        "convert_from(raw_body, 'UTF8')::jsonb = $2::jsonb",
                        key, bank_event_json("bf-ach-2")) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters") == 1);
    BOOST_TEST(reg.render().find("chargeguard_billing_failed_after_processing_total 1") != std::string::npos);
    // Again: nothing new, no second letter.
    auto again = f.run(b.run_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->inserted == 0u);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters") == 1);

    // The replay (as `dead-letters replay` does it): reopened at generation 2, the letter's body redelivered,
    // a new PaymentIntent under key-g2 — not the failed one replayed.
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(reopened.has_value());
    BOOST_TEST_REQUIRE(reopened->has_value());
    auto letter = f.run(f.query(
        "SELECT convert_from(raw_body, 'UTF8') FROM dead_letters WHERE billing_key = $1", pg::params(key)));
    BOOST_TEST_REQUIRE(letter.has_value());
    auto v = f.handle(*p, delivery_of((*letter)[0].get<std::string>(0), "6c03"));
    BOOST_TEST(reason(v) == "processing", v.detail);
    intents = intents_of(f);
    BOOST_TEST_REQUIRE(intents.size() == 2u);
    BOOST_TEST(intents[1].status == "processing");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'processing' AND "
                        "key_generation = 2 AND payment_intent_id = $2",
                        key, intents[1].id) == 1);
}

BOOST_AUTO_TEST_SUITE_END()
