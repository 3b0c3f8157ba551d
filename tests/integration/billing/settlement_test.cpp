// Payments that settle later, end to end on real PostgreSQL: the pipeline leaves a PaymentIntent answered
// `processing` as a processing row (never charged) and finishes the message; Stripe's events, recorded and
// applied by billing::settlement_store exactly as the webhook receiver does, move it to charged or to
// failed_after_processing with one dead letter, in every order and with duplicates; the replay charges
// again under a new key generation; the poll settles a row whose webhook never came.
// Stripe is the in-test double of settlement_support.hpp.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/heal/settlement_poller.hpp"
#include "billing/store/settlement_store.hpp"
#include "fixture.hpp"
#include "settlement_support.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::key_of;
using cg::test::reason;

namespace {

using namespace cg::test::settle_support;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_settlement)

// The pipeline: a PaymentIntent answered processing is a processing row, not charged; the message is
// finished; the row names the intent and keeps the delivery for a later dead letter. A redelivery is a
// prevented duplicate (no second intent).
BOOST_AUTO_TEST_CASE(processing_answer_is_not_charged) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("proc-1", *p);
    auto key = key_of("proc-1", "2026-12");
    BOOST_TEST(f.status_of(key) == "processing");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND payment_intent_id = $2 AND "
                        "stripe_status = 'processing' AND processing_since IS NOT NULL AND "
                        "convert_from(raw_body, 'UTF8') = $3 AND nsq_topic = 'billing'",
                        key, pi.id, intent_event_body("proc-1")) == 1);
    auto again = f.handle(*p, delivery_of(intent_event_body("proc-1"), "m-proc-1", 2));
    BOOST_TEST(reason(again) == "duplicate_prevented");
    BOOST_TEST(f.bank.intents.size() == 1u);
}

// requires_capture: an authorisation chargeguard never asks for. Not charged: processing, counted, alerted.
BOOST_AUTO_TEST_CASE(requires_capture_is_an_anomaly_not_a_charge) {
    settle_fixture f;
    auto p = f.async_pipeline();
    f.bank.next_status = "requires_capture";
    auto v = f.handle(*p, delivery_of(intent_event_body("cap-1"), "m-cap-1"));
    BOOST_TEST(reason(v) == "processing", v.detail);
    BOOST_TEST(f.status_of(key_of("cap-1", "2026-12")) == "processing");
    BOOST_TEST(f.counter("chargeguard_billing_requires_capture_total") == 1);
}

// Every order of processing and payment_failed, each delivered twice: failed_after_processing with exactly
// one dead letter carrying the original body; and succeeded in any order with processing ends charged.
BOOST_AUTO_TEST_CASE(every_order_of_processing_and_the_outcome) {
    settle_fixture f;
    auto p = f.async_pipeline();
    int n = 0;
    for (const char* outcome :
         {"payment_intent.payment_failed", "payment_intent.succeeded", "charge.failed", "charge.succeeded"}) {
        for (bool outcome_first : {true, false}) {
            std::string customer = "order-" + std::to_string(++n);
            auto pi = f.processing_row(customer, *p);
            auto key = key_of(customer, "2026-12");
            bool fails = std::string(outcome).ends_with("failed");
            std::string st = std::string(outcome).starts_with("charge.")
                                 ? (fails ? "failed" : "succeeded")
                                 : (fails ? "requires_payment_method" : "succeeded");
            auto proc = f.event("payment_intent.processing", pi, "processing", 0, 1700000000);
            auto end = f.event(outcome, pi, st, 0, 1700000100);
            std::vector<std::string> order =
                outcome_first ? std::vector{end, proc, end, proc} : std::vector{proc, end, proc, end};
            int duplicates = 0;
            for (const auto& e : order) duplicates += f.deliver(e).duplicate;
            BOOST_TEST(duplicates == 2);
            BOOST_TEST_CONTEXT(outcome << (outcome_first ? " first" : " last")) {
                BOOST_TEST(f.status_of(key) == (fails ? "failed_after_processing" : "charged"));
                BOOST_TEST(f.letters_for(key) == (fails ? 1 : 0));
                if (fails)
                    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE billing_key = $1 AND "
                                        "convert_from(raw_body, 'UTF8') = $2 AND topic = 'billing'",
                                        key, intent_event_body(customer)) == 1);
                else
                    BOOST_TEST(
                        f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND charge_id = $2",
                                 key, pi.latest_charge) == 1);
            }
        }
    }
}

// The failure reaches the receiver before the create call's answer (the row still pending): recorded,
// deferred; the pipeline, leaving the row processing, applies it: failed_after_processing, one letter.
BOOST_AUTO_TEST_CASE(payment_failed_before_processing) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto body = intent_event_body("early-1");
    auto key = key_of("early-1", "2026-12");
    f.dead_workers_row(body, "m-early", 1ms);  // pending, its lease about to lapse
    async_intent future;                       // the intent the bank is about to create for it
    future.id = "pi_1";
    future.latest_charge = "ch_1";
    future.billing_key = key;
    future.amount = 1999;
    auto early = f.deliver(f.event("payment_intent.payment_failed", future, "requires_payment_method"));
    BOOST_TEST(early.outcome == "deferred");
    BOOST_TEST(f.status_of(key) == "pending");
    auto v = f.handle(*p, delivery_of(body, "m-early", 2));
    BOOST_TEST(reason(v) == "processing", v.detail);
    BOOST_TEST(f.status_of(key) == "failed_after_processing");
    BOOST_TEST(f.letters_for(key) == 1);
    BOOST_TEST(f.counter("chargeguard_billing_failed_after_processing_total") == 1);
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM stripe_webhook_events WHERE outcome = 'applied' AND applied_to = $1",
                 key) == 1);
}

// Failed after processing → dead letter → replay: the row reopens under a new key generation and the
// redelivered message charges once (a new PaymentIntent under key-g2); the old intent's late events name
// another payment and change nothing.
BOOST_AUTO_TEST_CASE(replay_after_a_late_failure_charges_under_a_new_generation) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("replay-1", *p);
    auto key = key_of("replay-1", "2026-12");
    f.deliver(f.event("payment_intent.payment_failed", pi, "requires_payment_method"));
    BOOST_TEST_REQUIRE(f.status_of(key) == "failed_after_processing");
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(reopened.has_value());
    BOOST_TEST_REQUIRE(reopened->has_value());
    BOOST_TEST(billing::to_string(**reopened) == "failed_after_processing");
    BOOST_TEST(f.status_of(key) == "pending");
    // The letter's body, as `dead-letters replay` publishes it.
    auto letter = f.run(f.query(
        "SELECT convert_from(raw_body, 'UTF8') FROM dead_letters WHERE billing_key = $1", pg::params(key)));
    BOOST_TEST_REQUIRE(letter.has_value());
    f.bank.next_status = "succeeded";
    auto v = f.handle(*p, delivery_of((*letter)[0].get<std::string>(0), "m-replay-2"));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.bank.intents.size() == 2u);
    BOOST_TEST(f.bank.intents[1].idempotency_key == key + "-g2");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'charged' AND "
                        "payment_intent_id = 'pi_2' AND key_generation = 2",
                        key) == 1);
    // The first intent's events, late: another payment than the row's.
    auto late = f.deliver(f.event("payment_intent.processing", pi, "processing"));
    BOOST_TEST(late.outcome == "other_payment");
    BOOST_TEST(f.status_of(key) == "charged");
    // A second replay of the same letter finds the row charged: nothing reopened.
    auto again = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(!again->has_value());
}

// After a replay, the failed payment it superseded still carries the key. A replayed charge whose answer is
// lost (500) is searched for: the old failed PaymentIntent is not this generation's decline — the row goes on
// to a new generation and is charged once, never left declined (the customer would pay nothing).
BOOST_AUTO_TEST_CASE(the_search_after_a_replay_ignores_the_superseded_failure) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("super-1", *p);
    auto key = key_of("super-1", "2026-12");
    f.deliver(f.event("payment_intent.payment_failed", pi, "requires_payment_method"));
    f.bank.find(pi.id)->status = "requires_payment_method";
    BOOST_TEST_REQUIRE(f.status_of(key) == "failed_after_processing");
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(reopened.has_value());
    f.bank.fail_next_create = true;
    auto lost = f.handle(*p, delivery_of(intent_event_body("super-1"), "m-super-2"));
    BOOST_TEST(reason(lost) == "requeued_indeterminate", lost.detail);
    f.bank.next_status = "succeeded";
    auto v = f.handle(*p, delivery_of(intent_event_body("super-1"), "m-super-2", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.status_of(key) == "charged");
    BOOST_TEST_REQUIRE(f.bank.intents.size() == 2u);
    BOOST_TEST(f.bank.intents[1].idempotency_key == key + "-g3");
    BOOST_TEST(f.bank.intents[1].status == "succeeded");
}

// A failover lost the bump to generation 2 after its call had made a debit, and recovery recorded that debit
// (failed after processing) under generation 1. The replay reopens under generation 2, whose key Stripe
// answers with that same failed debit: the key is spent, so the row takes generation 3 at once and charges.
BOOST_AUTO_TEST_CASE(a_replay_whose_key_stripe_already_spent_charges_under_the_next_generation) {
    settle_fixture f;
    auto p = f.async_pipeline();
    f.processing_row("spent-1", *p);
    auto key = key_of("spent-1", "2026-12");
    f.bank.intents.push_back(async_intent{"pi_lost", "requires_payment_method", "ch_lost", key, "cus_ok",
                                          key + "-g2", "insufficient_funds", 1999});
    auto moved =
        f.run(f.query("UPDATE billing_records SET status = 'failed_after_processing', "
                      "payment_intent_id = 'pi_lost', charge_id = 'ch_lost', key_generation = 1 "
                      "WHERE key = $1 RETURNING key",
                      pg::params(key)));
    BOOST_TEST_REQUIRE((moved && moved->size() == 1u));
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE((reopened && reopened->has_value()));
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM billing_retries WHERE key = $1 AND generation = 2 AND "
                 "previous_payment_intent_id = 'pi_lost' AND previous_status = 'failed_after_processing'",
                 key) == 1);
    f.bank.next_status = "succeeded";
    auto v = f.handle(*p, delivery_of(intent_event_body("spent-1"), "m-spent-2"));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.bank.intents.size() == 3u);
    BOOST_TEST(f.bank.intents[2].idempotency_key == key + "-g3");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'charged' AND "
                        "payment_intent_id = $2 AND key_generation = 3",
                        key, f.bank.intents[2].id) == 1);
}

// Events for objects no row names, and types not acted on: recorded once, counted, nothing changed.
BOOST_AUTO_TEST_CASE(unknown_objects_and_types_are_recorded_and_ignored) {
    settle_fixture f;
    async_intent stranger;
    stranger.id = "pi_stranger";
    stranger.latest_charge = "ch_stranger";
    stranger.billing_key = "0123456789abcdef0123456789abcdef";
    auto body = f.event("payment_intent.succeeded", stranger, "succeeded");
    BOOST_TEST(f.deliver(body).outcome == "unknown_object");
    BOOST_TEST(f.deliver(body).duplicate);
    auto other = R"({"id":"evt_other","object":"event","type":"customer.created","created":1,)"
                 R"("livemode":false,"data":{"object":{"id":"cus_1","object":"customer"}}})";
    BOOST_TEST(f.deliver(other).outcome == "unknown_type");
    BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_webhook_events") == 2);
}

// No webhook: the poll retrieves rows processing past the bound by id and applies the same step — a
// succeeded intent is charged, a failed one is failed_after_processing with its letter; rows not due yet
// are left alone; the bounded rate holds.
BOOST_AUTO_TEST_CASE(poll_settles_rows_whose_webhook_never_came) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto ok = f.processing_row("poll-ok", *p);
    auto bad = f.processing_row("poll-bad", *p);
    auto fresh = f.processing_row("poll-fresh", *p);
    f.bank.find(ok.id)->status = "succeeded";
    f.bank.find(bad.id)->status = "requires_payment_method";
    f.bank.find(bad.id)->failure = "insufficient_funds";
    f.bank.find(fresh.id)->status = "succeeded";
    // Two rows processing for an hour; the third just now.
    auto aged = f.run(
        f.query("UPDATE billing_records SET processing_since = now() - interval '2 hours' "
                "WHERE key = ANY($1::text[])",
                pg::params("{" + key_of("poll-ok", "2026-12") + "," + key_of("poll-bad", "2026-12") + "}")));
    BOOST_TEST_REQUIRE(aged.has_value());
    billing::poller_config pc;
    pc.poll_after = 1h;
    pc.rate_per_second = 50;
    billing::settlement_poller poller(pc, f.pg, *f.async_client, logger(), &f.settle_reg);
    auto swept = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(swept.has_value(), (swept ? "" : swept.err().describe()));
    BOOST_TEST(swept->retrieved == 2u);
    BOOST_TEST(f.bank.retrieves == 2);
    BOOST_TEST(f.status_of(key_of("poll-ok", "2026-12")) == "charged");
    BOOST_TEST(f.status_of(key_of("poll-bad", "2026-12")) == "failed_after_processing");
    BOOST_TEST(f.letters_for(key_of("poll-bad", "2026-12")) == 1);
    BOOST_TEST(f.status_of(key_of("poll-fresh", "2026-12")) == "processing");
    BOOST_TEST(f.counter("chargeguard_billing_failed_after_processing_total") == 1);
    BOOST_TEST(f.counter("chargeguard_billing_processing_records") == 1);  // poll-fresh
    BOOST_TEST(f.counter("chargeguard_billing_oldest_processing_age_seconds") < 3600);
    // Polled rows are not due again until the bound passes once more.
    auto again = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->retrieved == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
