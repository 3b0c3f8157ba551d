// Key conflicts in the pipeline against real PostgreSQL and fake-stripe: another payload under a key, the
// same customer and period under another key, and Stripe's idempotency errors are dead-lettered or requeued
// with the ledger untouched, and never charged twice. g++ 12 -O2 false positive on Asio coroutine frames (GCC
// bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "stripe/types.hpp"
#include "support/prom_text.hpp"

using namespace std::chrono_literals;
using namespace cg;
using billing::verdict_reason;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::first_sample;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;
using cg::test::watch_pending_age;

namespace {

using fixture = test::billing_fixture;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_pipeline)

// Same customer and period, another amount: dead-lettered "conflict", the recorded row untouched, one charge;
// a redelivery of the conflicting message adds no second letter.
BOOST_AUTO_TEST_CASE(payload_conflict_is_dead_lettered_and_ledger_untouched) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("acme-3", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 1000), "0c01"))) == "charged");
    auto v = f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 2000), "0c02"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail == "conflict");
    auto again = f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 2000), "0c02", 2));
    BOOST_TEST(reason(again) == "dead_lettered");
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = $1 AND reason = 'conflict' "
                 "AND billing_key = $2 AND attempts = 1 AND topic = 'billing' AND channel = 'chargeguard'",
                 std::string("0c02"), key) == 1);
    BOOST_TEST(f.dead_letters("0c01") == 0);
    auto rec = f.row(key);
    BOOST_TEST(rec->amount_cents == 1000);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 1);
}

// Same customer and period under another key namespace: the UNIQUE (customer_id, billing_period) row
// conflicts, not the key. Dead-lettered "conflict" naming the recorded key; never a second charge.
BOOST_AUTO_TEST_CASE(same_customer_period_under_another_key_is_a_conflict) {
    fixture f;
    auto p = f.make_pipeline();
    auto cfg = f.config_for_pipeline();
    cfg.key_namespace = "other-ns";
    auto other = f.make_pipeline(cfg);
    auto body = event_json("acme-15", "2026-11", 1800);
    auto key = key_of("acme-15", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "1701"))) == "charged");
    auto v = f.handle(*other, delivery_of(body, "1702"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail == "conflict");
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1702' AND reason = 'conflict' "
                 "AND billing_key = $1",
                 key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records") == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Stripe already saw the key with other parameters (400 idempotency_error): status conflict, dead letter,
// FIN.
BOOST_AUTO_TEST_CASE(stripe_idempotency_error_marks_conflict_and_dead_letters) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-16", "2026-11", 1900);
    auto key = key_of("acme-16", "2026-11");
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    auto other = *ev;
    other.amount_cents = 1901;
    auto pre = f.run(f.stripe->create_charge(billing::build_charge_request(other, key, 1)));
    BOOST_TEST_REQUIRE((pre.cls == stripe::outcome_class::succeeded));
    auto v = f.handle(*p, delivery_of(body, "1801"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail.find("idempotency_error") != std::string::npos, v.detail);
    BOOST_TEST(billing::to_string(f.row(key)->status) == "conflict");
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1801' AND "
                        "reason = 'stripe idempotency_error' AND billing_key = $1",
                        key) == 1);
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "1801", 2))) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == 2);
}

// A request refused for our setup (401: a bad or rotated API key) says nothing about the event: it stays
// pending, no dead letter, the message is requeued — and once the key is fixed the same event is charged,
// once. (Dead-lettering it, as a "rejected" event, would leave the customer uncharged for good: the letter's
// replay meets a final row.)
BOOST_AUTO_TEST_CASE(stripe_refusing_our_key_requeues_and_charges_once_the_key_is_fixed) {
    fixture f;
    auto sc = f.config();
    sc.api_key = "bad_key";
    auto bad_client = f.client(sc);
    billing::charge_flow p(f.config_for_pipeline(), *f.ledger, *bad_client, logger());
    auto body = event_json("acme-17", "2026-11", 2000);
    auto key = key_of("acme-17", "2026-11");
    auto v = f.handle(p, delivery_of(body, "1901"));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_stripe_unavailable");
    BOOST_TEST(v.delay.count() == 104);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "pending");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND last_error LIKE '%401%' AND "
                        "lease_until < now()",
                        key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters") == 0);
    BOOST_TEST(f.fake->charges().empty());
    // The operator fixes the key; the redelivery charges the same event under the same key.
    auto again = f.handle(*f.make_pipeline(), delivery_of(body, "1901", 2));
    BOOST_TEST(reason(again) == "charged");
    BOOST_TEST(billing::to_string(f.row(key)->status) == "charged");
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
