// The settlement step (billing/machine/settlement.hpp) reading Stripe: the event types it maps to facts, each
// kind of object it parses, and the connected account an event names.
#include <boost/test/unit_test.hpp>

#include "billing/machine/settlement.hpp"
#include "settlement_support.hpp"

using namespace cg::billing;

namespace {

using namespace cg::test::settlement_support;

}  // namespace

BOOST_AUTO_TEST_CASE(event_types_map_to_facts) {
    BOOST_TEST(fact_kind_for_event("payment_intent.processing") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_event("payment_intent.succeeded") == fact_kind::succeeded);
    BOOST_TEST(fact_kind_for_event("charge.succeeded") == fact_kind::succeeded);
    BOOST_TEST(fact_kind_for_event("payment_intent.payment_failed") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("payment_intent.canceled") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("charge.failed") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("charge.refunded") == fact_kind::refunded);
    for (const char* t : {"refund.created", "refund.updated", "charge.refund.updated"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::refund_update, t);
    // Not an event type of the pinned API version: a refund's failure comes as refund.updated.
    BOOST_TEST(fact_kind_for_event("refund.failed") == fact_kind::unknown_type);
    for (const char* t :
         {"charge.dispute.created", "charge.dispute.updated", "charge.dispute.funds_withdrawn"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::dispute_opened, t);
    for (const char* t : {"charge.dispute.closed", "charge.dispute.funds_reinstated"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::dispute_closed, t);
    BOOST_TEST(fact_kind_for_event("customer.created") == fact_kind::unknown_type);
    BOOST_TEST(fact_kind_for_intent_status("requires_capture") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_intent_status("requires_payment_method") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_intent_status("canceled") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_intent_status("requires_action") == fact_kind::no_news);
    BOOST_TEST(fact_kind_for_charge_status("pending") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_charge_status("failed") == fact_kind::failed);
}

BOOST_AUTO_TEST_CASE(parses_each_object_kind) {
    auto pi = parse_event_fact(
        R"({"id":"evt_1","object":"event","type":"payment_intent.payment_failed","created":1700000000,)"
        R"("data":{"object":{"id":"pi_9","object":"payment_intent","status":"requires_payment_method",)"
        R"("latest_charge":"ch_9","metadata":{"billing_key":"abc"},)"
        R"("last_payment_error":{"code":"insufficient_funds"}}}})");
    BOOST_TEST_REQUIRE(pi.has_value());
    BOOST_TEST(pi->kind == fact_kind::failed);
    BOOST_TEST(pi->payment_intent_id == "pi_9");
    BOOST_TEST(pi->charge_id == "ch_9");
    BOOST_TEST(pi->billing_key == "abc");
    BOOST_TEST(pi->failure == "insufficient_funds");
    BOOST_TEST(pi->created == 1700000000);
    auto ch = parse_event_fact(
        R"({"id":"evt_2","object":"event","type":"charge.refunded","created":1,"data":{"object":{"id":"ch_9",)"
        R"("object":"charge","status":"succeeded","payment_intent":{"id":"pi_9"},"amount_refunded":700}}})");
    BOOST_TEST_REQUIRE(ch.has_value());
    BOOST_TEST(ch->kind == fact_kind::refunded);
    BOOST_TEST(ch->charge_id == "ch_9");
    BOOST_TEST(ch->payment_intent_id == "pi_9");
    BOOST_TEST(ch->amount_refunded == 700);
    auto dp = parse_event_fact(
        R"({"id":"evt_3","object":"event","type":"charge.dispute.closed","created":1,"data":{"object":{)"
        R"("id":"dp_1","object":"dispute","charge":"ch_9","payment_intent":null,"amount":300,"status":"lost"}}})");
    BOOST_TEST_REQUIRE(dp.has_value());
    BOOST_TEST(dp->kind == fact_kind::dispute_closed);
    BOOST_TEST(dp->charge_id == "ch_9");
    BOOST_TEST(dp->payment_intent_id.empty());
    BOOST_TEST(dp->dispute_amount == 300);
    BOOST_TEST(dp->status == "lost");
    auto re = parse_event_fact(
        R"({"id":"evt_4","object":"event","type":"refund.updated","created":5,"data":{"object":{"id":"re_1",)"
        R"("object":"refund","amount":400,"charge":"ch_9","payment_intent":"pi_9","status":"failed",)"
        R"("failure_reason":"lost_or_stolen_card","metadata":{}}}})");
    BOOST_TEST_REQUIRE(re.has_value());
    BOOST_TEST(re->kind == fact_kind::refund_update);
    BOOST_TEST(re->refund_id == "re_1");
    BOOST_TEST(re->refund_amount == 400);
    BOOST_TEST(re->charge_id == "ch_9");
    BOOST_TEST(re->payment_intent_id == "pi_9");
    BOOST_TEST(re->status == "failed");
    BOOST_TEST(re->failure == "lost_or_stolen_card");
    // A refund event proves the charge went through, and moves no amount itself (the store sums refunds).
    settlement_row processing_row;
    processing_row.status = record_status::processing;
    processing_row.amount_cents = 1000;
    processing_row.payment_intent_id = "pi_9";
    auto proved = apply_fact(processing_row, *re);
    BOOST_TEST(proved.row.status == record_status::charged);
    BOOST_TEST(proved.row.refunded_cents == 0);
    // A refund without its id, or naming no payment, cannot be counted once: refused.
    BOOST_TEST(!parse_event_fact(
        R"({"type":"refund.created","data":{"object":{"object":"refund","amount":1,"charge":"ch_9"}}})"));
    BOOST_TEST(
        !parse_event_fact(R"({"type":"refund.created","data":{"object":{"id":"re_2","object":"refund"}}})"));
    // A type we act on with another object is a different API shape: refused, not guessed at.
    BOOST_TEST(!parse_event_fact(R"({"type":"charge.refunded","data":{"object":{"object":"customer"}}})"));
    BOOST_TEST(!parse_event_fact("not json"));
    auto other = parse_event_fact(R"({"type":"customer.created","data":{"object":{"object":"customer"}}})");
    BOOST_TEST_REQUIRE(other.has_value());
    BOOST_TEST(other->kind == fact_kind::unknown_type);
}

BOOST_AUTO_TEST_CASE(the_events_account_is_read) {
    auto f = parse_event_fact(
        R"({"id":"evt_1","object":"event","type":"charge.failed","created":1700000000,"account":"acct_X",)"
        R"("data":{"object":{"id":"ch_9","object":"charge","payment_intent":"pi_9","status":"failed"}}})");
    BOOST_TEST_REQUIRE(f.has_value());
    BOOST_TEST(f->account == "acct_X");
    auto platform = parse_event_fact(
        R"({"id":"evt_2","object":"event","type":"charge.failed","created":1700000000,)"
        R"("data":{"object":{"id":"ch_9","object":"charge","payment_intent":"pi_9","status":"failed"}}})");
    BOOST_TEST_REQUIRE(platform.has_value());
    BOOST_TEST(platform->account.empty());
}
