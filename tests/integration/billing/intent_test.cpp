// PaymentIntents per event (issue 12 §3) end to end: real PostgreSQL, fake-stripe over TLS, the real
// stripe::client. An event with a payment_method is charged through a confirmed PaymentIntent; the ledger
// records the intent's latest_charge and the intent; SCA answers are final declines; recovery searches the
// customer's PaymentIntents too. g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "stripe/types.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;

namespace {

using fixture = test::billing_fixture;

std::string intent_event(const std::string& customer, const std::string& period, std::int64_t amount,
                         const std::string& stripe_customer = "cus_ok", const std::string& extra = "") {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","payment_method":"pm_card_visa")" + extra + "}";
}

// The payment_intent_id column (migration 0006), or "" when NULL.
std::string intent_column(fixture& f, const std::string& key) {
    auto r = f.run(f.query("SELECT coalesce(payment_intent_id, '') FROM billing_records WHERE key = $1",
                           pg::params(key)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST_REQUIRE(r->size() == 1u);
    return (*r)[0].get<std::string>(0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_payment_intents)

// payment_method → POST /v1/payment_intents (confirm, off_session, key, metadata), no /v1/charges POST; the
// row is charged with the intent's latest_charge and records the intent.
BOOST_AUTO_TEST_CASE(event_with_payment_method_is_charged_through_a_payment_intent) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("pi-1", "2026-11");
    auto v = f.handle(*p, delivery_of(intent_event("pi-1", "2026-11", 1999), "2a01"));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    const auto& pi = f.fake->intents()[0];
    BOOST_TEST(pi.status == "succeeded");
    BOOST_TEST(pi.payment_method == "pm_card_visa");
    BOOST_TEST(pi.amount == 1999);
    stripe::metadata md(pi.metadata.begin(), pi.metadata.end());
    BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == key);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);  // the intent's own charge, nothing else
    BOOST_TEST(f.fake->charges()[0].payment_intent == pi.id);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == pi.latest_charge);
    BOOST_TEST(intent_column(f, key) == pi.id);
    // A redelivery is a prevented duplicate: no second intent.
    BOOST_TEST(reason(f.handle(*p, delivery_of(intent_event("pi-1", "2026-11", 1999), "2a01", 2))) ==
               "duplicate_prevented");
    BOOST_TEST(f.fake->intents().size() == 1u);
}

// Off-session and the card wants 3-D Secure: 402 authentication_required → declined (final) with the reason,
// the intent and its failed charge recorded; a redelivery does not try again.
BOOST_AUTO_TEST_CASE(authentication_required_off_session_is_a_final_decline) {
    fixture f;
    auto p = f.make_pipeline();
    f.fake->decline("cus_sca", {"authentication_required", ""});
    auto key = key_of("pi-2", "2026-11");
    auto body = intent_event("pi-2", "2026-11", 500, "cus_sca");
    auto v = f.handle(*p, delivery_of(body, "2a02"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "needs_authentication", v.detail);
    BOOST_TEST(v.detail.find("authentication_required") != std::string::npos, v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "declined");
    BOOST_TEST(rec->charge_id.value_or("") == f.fake->intents()[0].latest_charge);
    BOOST_TEST(intent_column(f, key) == f.fake->intents()[0].id);
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "2a02", 2))) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == 1);
}

// "off_session":false and the card wants 3-D Secure: Stripe answers 200 requires_action (no charge) →
// declined with the status as the reason, the intent recorded, no charge id.
BOOST_AUTO_TEST_CASE(requires_action_on_session_is_a_decline) {
    fixture f;
    auto p = f.make_pipeline();
    f.fake->decline("cus_sca", {"authentication_required", ""});
    auto key = key_of("pi-3", "2026-11");
    auto v = f.handle(
        *p, delivery_of(intent_event("pi-3", "2026-11", 600, "cus_sca", R"(,"off_session":false)"), "2a03"));
    BOOST_TEST(reason(v) == "needs_authentication", v.detail);
    BOOST_TEST(v.detail.find("requires_action") != std::string::npos, v.detail);
    BOOST_TEST(f.fake->charges().empty());
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "declined");
    BOOST_TEST(!rec->charge_id.has_value());
    BOOST_TEST(intent_column(f, key) == f.fake->intents()[0].id);
}

// 500 after Stripe created an intent that stopped at requires_action (so no charge exists to find): the
// recovery search must look at the customer's PaymentIntents, find it and decline — not take generation 2 and
// create a second intent.
BOOST_AUTO_TEST_CASE(recovery_finds_an_intent_that_made_no_charge) {
    fixture f;
    auto p = f.make_pipeline();
    f.fake->decline("cus_sca", {"authentication_required", ""});
    auto key = key_of("pi-4", "2026-11");
    auto body = intent_event("pi-4", "2026-11", 700, "cus_sca", R"(,"off_session":false)");
    f.fake->faults().fail_after_create = 1;
    auto v = f.handle(*p, delivery_of(body, "2a04"));
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    BOOST_TEST(f.fake->charges().empty());

    auto v2 = f.handle(*p, delivery_of(body, "2a04", 2));
    BOOST_TEST(reason(v2) == "needs_authentication", v2.detail);
    BOOST_TEST(v2.detail.find("requires_action") != std::string::npos, v2.detail);
    BOOST_TEST(f.fake->intents().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key + "-g2") == 0);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "declined");
    BOOST_TEST(rec->key_generation == 1);
    BOOST_TEST(intent_column(f, key) == f.fake->intents()[0].id);
}

// 500 after a succeeded intent: the search finds its charge (carrying the intent's metadata) and records the
// charge and the intent; one intent, one POST.
BOOST_AUTO_TEST_CASE(server_error_after_a_succeeded_intent_is_resolved_by_search) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("pi-5", "2026-11");
    auto body = intent_event("pi-5", "2026-11", 800);
    f.fake->faults().fail_after_create = 1;
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "2a05"))) == "requeued_indeterminate");
    auto v = f.handle(*p, delivery_of(body, "2a05", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    auto rec = f.row(key);
    BOOST_TEST(rec->charge_id.value_or("") == f.fake->intents()[0].latest_charge);
    BOOST_TEST(intent_column(f, key) == f.fake->intents()[0].id);
}

// The search finds an intent carrying our key that Stripe never confirmed (requires_confirmation: the
// confirm inside our create-and-confirm never ran): Stripe never tried the card, so declining would leave
// the customer uncharged for good. Recovery goes on to generation 2, whose intent charges.
BOOST_AUTO_TEST_CASE(recovery_charges_past_an_intent_that_was_never_confirmed) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("pi-6", "2026-11");
    auto body = intent_event("pi-6", "2026-11", 900);
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    auto unconfirmed = billing::build_intent_request(*ev, key, 1);
    unconfirmed.confirm = false;
    unconfirmed.off_session = false;
    unconfirmed.idempotency_key = "left-unconfirmed";
    f.run(f.stripe->create_payment_intent(unconfirmed));  // 200, but an intent that moved no money
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    BOOST_TEST_REQUIRE(f.fake->intents()[0].status == "requires_confirmation");
    // The worker that made it got a 500 and marked the row indeterminate.
    auto rec = f.dead_workers_row(body, "2a06", 30s);
    auto marked = f.run(f.ledger->mark_indeterminate(key, rec.lease_epoch, "HTTP 500 api_error"));
    BOOST_TEST_REQUIRE((marked.has_value() && *marked));

    auto v = f.handle(*p, delivery_of(body, "2a06", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 2u);
    const auto& second = f.fake->intents()[1];
    BOOST_TEST(second.status == "succeeded");
    BOOST_TEST(f.fake->posts_for(key + "-g2") == 1);
    auto after = f.row(key);
    BOOST_TEST(billing::to_string(after->status) == "charged");
    BOOST_TEST(after->key_generation == 2);
    BOOST_TEST(after->charge_id.value_or("") == second.latest_charge);
    BOOST_TEST(intent_column(f, key) == second.id);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// The client's PaymentIntent search pages through the customer's intents (newest first) by metadata.
BOOST_AUTO_TEST_CASE(payment_intent_search_pages_through_the_customer) {
    fixture f;
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) {
        stripe::payment_intent_request req;
        req.amount = 100 + i;
        req.currency = "usd";
        req.customer = "cus_list";
        req.payment_method = "pm_card_visa";
        req.metadata = {{"billing_key", "bk-" + std::to_string(i)}};
        req.idempotency_key = "list-" + std::to_string(i);
        auto out = f.run(f.stripe->create_payment_intent(req));
        BOOST_TEST_REQUIRE((out.cls == stripe::outcome_class::succeeded), out.message);
        ids.push_back(out.payment_intent_id);
    }
    auto oldest = f.run(f.stripe->find_payment_intent_by_billing_key("cus_list", "bk-0", std::nullopt, 1));
    BOOST_TEST_REQUIRE(oldest.has_value());
    BOOST_TEST_REQUIRE(oldest->has_value());
    BOOST_TEST((*oldest)->id == ids[0]);
    BOOST_TEST((*oldest)->status == "succeeded");
    auto none = f.run(f.stripe->find_payment_intent_by_billing_key("cus_list", "bk-9", std::nullopt, 2));
    BOOST_TEST_REQUIRE(none.has_value());
    BOOST_TEST(!none->has_value());
    auto other = f.run(f.stripe->find_payment_intent_by_billing_key("cus_other", "bk-0", std::nullopt, 2));
    BOOST_TEST_REQUIRE(other.has_value());
    BOOST_TEST(!other->has_value());
}

BOOST_AUTO_TEST_SUITE_END()
