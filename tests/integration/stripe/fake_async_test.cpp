// fake-stripe's payments that settle later, refunds and disputes, driven through stripe::client over TLS,
// with the signed webhook events each sends (fake_async_fixture.hpp). How deliveries are retried, duplicated,
// reordered and signed is fake_webhook_delivery_test.cpp; what requests fake-stripe refuses and its search,
// fake_requests_test.cpp.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "tests/integration/stripe/fake_async_fixture.hpp"

BOOST_AUTO_TEST_SUITE(fake_async)

// The intermediate state is read over HTTP, so here the settlement waits for the test's word (the delayed
// settlement is bank_debit_fails_after_processing's): a timer short enough for the suite could fire between
// two requests on a loaded machine.
BOOST_AUTO_TEST_CASE(bank_debit_processing_then_succeeded_with_signed_events) {
    async_fixture f;
    f.fake->settle_after(std::chrono::hours(1));
    auto c = f.client();
    std::string pi_id;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("ach-ok", "pm_usBankAccount_success"));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        BOOST_TEST(o.intent->status == "processing");
        pi_id = o.intent->id;
        auto now = co_await c->retrieve_payment_intent(pi_id);
        BOOST_TEST_REQUIRE(now.has_value());
        BOOST_TEST(now->status == "processing");
        auto ch = co_await c->retrieve_charge(now->latest_charge);
        BOOST_TEST_REQUIRE(ch.has_value());
        BOOST_TEST(ch->status == "pending");
        BOOST_TEST(!ch->paid);
        BOOST_TEST(ch->payment_method_type == "us_bank_account");  // payment_method_details.type
        BOOST_TEST(f.fake->pending_settlements() == 1);
        BOOST_TEST_REQUIRE(f.fake->settle(pi_id, "succeeded"));
        BOOST_TEST_REQUIRE(co_await f.fake->webhooks().wait([&] { return f.fake->webhooks().idle(); }, 10s));
        auto later = co_await c->retrieve_payment_intent(pi_id);
        BOOST_TEST_REQUIRE(later.has_value());
        BOOST_TEST(later->status == "succeeded");
        auto ch2 = co_await c->retrieve_charge(later->latest_charge);
        BOOST_TEST_REQUIRE(ch2.has_value());
        BOOST_TEST(ch2->status == "succeeded");
        BOOST_TEST(ch2->paid);
    });
    std::vector<std::string> want = {"payment_intent.created", "payment_intent.processing", "charge.pending",
                                     "charge.succeeded", "payment_intent.succeeded"};
    BOOST_TEST(f.hook.types() == want, boost::test_tools::per_element());
    for (const auto& h : f.hook.hits) {
        BOOST_TEST(signed_by(h, secret), h.type);
        BOOST_TEST(!signed_by(h, previous));
        BOOST_TEST(h.content_type == "application/json; charset=utf-8");
        BOOST_TEST(h.user_agent == "Stripe/1.0 (+https://stripe.com/docs/webhooks)");
        BOOST_TEST(h.signature.find(",v0=") != std::string::npos);                   // Stripe's test-mode v0
        BOOST_TEST(h.body.find("\n  \"object\": \"event\",") != std::string::npos);  // pretty-printed
    }
    // The succeeded event carries the intent as it was then; GET /v1/events/{id} serves the same bytes.
    const auto& last = f.hook.hits.back();
    BOOST_TEST(last.body.find("\"status\": \"succeeded\"") != std::string::npos);
    BOOST_TEST(f.fake->events().back().body == last.body);
    auto st = f.fake->webhooks().stats();
    BOOST_TEST(st.acked_events == 5u);
    BOOST_TEST(st.failed == 0u);
}

BOOST_AUTO_TEST_CASE(bank_debit_fails_after_processing) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("ach-nsf", "pm_usBankAccount_insufficientFunds"));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        BOOST_TEST(o.intent->status == "processing");
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto pi = co_await c->retrieve_payment_intent(o.intent->id);
        BOOST_TEST_REQUIRE(pi.has_value());
        BOOST_TEST(pi->status == "requires_payment_method");
        BOOST_TEST(pi->last_error_code == "insufficient_funds");
        auto ch = co_await c->retrieve_charge(pi->latest_charge);
        BOOST_TEST_REQUIRE(ch.has_value());
        BOOST_TEST(ch->status == "failed");
        BOOST_TEST(ch->failure_code == "insufficient_funds");
    });
    auto t = f.hook.types();
    BOOST_TEST_REQUIRE(t.size() == 5u);
    BOOST_TEST(t[3] == "charge.failed");
    BOOST_TEST(t[4] == "payment_intent.payment_failed");
}

BOOST_AUTO_TEST_CASE(processing_method_waits_for_a_hand_settlement_or_a_cancel) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->create_payment_intent(pi_req("ach-stuck-1", "pm_usBankAccount_processing"));
        auto b = co_await c->create_payment_intent(pi_req("ach-stuck-2", "pm_usBankAccount_processing"));
        BOOST_TEST_REQUIRE((a.intent && b.intent));
        BOOST_TEST(f.fake->pending_settlements() == 0);  // never settles by itself
        BOOST_TEST(f.fake->settle(a.intent->id, "failed", "account_closed"));
        BOOST_TEST(!f.fake->settle(a.intent->id, "succeeded"));  // no longer processing
        auto cancel =
            co_await c->call("POST", "/v1/payment_intents/" + b.intent->id + "/cancel", "", "cancel-stuck-2");
        BOOST_TEST(cancel.http.resp.status == 200);
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto pa = co_await c->retrieve_payment_intent(a.intent->id);
        auto pb = co_await c->retrieve_payment_intent(b.intent->id);
        BOOST_TEST_REQUIRE((pa && pb));
        BOOST_TEST(pa->last_error_code == "account_closed");
        BOOST_TEST(pb->status == "canceled");
    });
    auto t = f.hook.types();
    BOOST_TEST(std::count(t.begin(), t.end(), "payment_intent.canceled") == 1);
    BOOST_TEST(std::count(t.begin(), t.end(), "payment_intent.payment_failed") == 1);
}

BOOST_AUTO_TEST_CASE(a_customer_bank_outcome_overrides_the_test_method) {
    async_fixture f;
    f.fake->bank_outcome("cus_bank", "succeeded");
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o =
            co_await c->create_payment_intent(pi_req("ach-topped-up", "pm_usBankAccount_insufficientFunds"));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        BOOST_TEST(o.intent->status == "processing");
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto pi = co_await c->retrieve_payment_intent(o.intent->id);
        BOOST_TEST_REQUIRE(pi.has_value());
        BOOST_TEST(pi->status == "succeeded");
    });
}

BOOST_AUTO_TEST_CASE(refunds_partial_full_idempotent_and_refused) {
    async_fixture f;
    f.only({"charge.refunded", "refund.created"});
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("card-1", "pm_card_visa", 4200));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        BOOST_TEST(o.intent->status == "succeeded");
        auto ch = o.intent->latest_charge;

        auto r1 = co_await c->call("POST", "/v1/refunds", "charge=" + ch + "&amount=1000", "refund-1");
        BOOST_TEST(r1.http.resp.status == 200);
        BOOST_TEST(field(r1.http.resp.body, "object") == "refund");
        auto again = co_await c->call("POST", "/v1/refunds", "charge=" + ch + "&amount=1000", "refund-1");
        BOOST_TEST(again.replayed);
        BOOST_TEST(field(again.http.resp.body, "id") == field(r1.http.resp.body, "id"));
        BOOST_TEST(f.fake->refunds().size() == 1u);

        auto big = co_await c->call("POST", "/v1/refunds", "charge=" + ch + "&amount=5000", "refund-2");
        BOOST_TEST(big.http.resp.status == 400);
        BOOST_TEST_REQUIRE(big.error.has_value());
        BOOST_TEST(big.error->code == "amount_too_large");
        BOOST_TEST(big.error->param == "amount");
        BOOST_TEST(big.error->message ==
                   "Refund amount ($50.00) is greater than unrefunded amount on charge ($32.00)");

        // Validation refusals are not saved: the same key works once the parameters are fixed.
        auto none = co_await c->call("POST", "/v1/refunds", "amount=1", "refund-3");
        BOOST_TEST(none.http.resp.status == 400);
        BOOST_TEST_REQUIRE(none.error.has_value());
        BOOST_TEST(none.error->code == "parameter_missing");
        auto rest = co_await c->call("POST", "/v1/refunds", "payment_intent=" + o.intent->id, "refund-3");
        BOOST_TEST(rest.http.resp.status == 200);
        BOOST_TEST(rest.http.resp.body.find("\"amount\":3200") != std::string::npos);

        auto charge = co_await c->retrieve_charge(ch);
        BOOST_TEST_REQUIRE(charge.has_value());
        auto done = co_await c->call("POST", "/v1/refunds", "charge=" + ch, "refund-4");
        BOOST_TEST(done.http.resp.status == 400);
        BOOST_TEST_REQUIRE(done.error.has_value());
        BOOST_TEST(done.error->code == "charge_already_refunded");
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->charges()[0].amount_refunded == 4200);
    auto t = f.hook.types();
    std::vector<std::string> want = {"charge.refunded", "refund.created", "charge.refunded",
                                     "refund.created"};
    BOOST_TEST(t == want, boost::test_tools::per_element());
    BOOST_TEST(f.hook.hits[2].body.find("\"refunded\": true") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(disputes_open_close_and_block_refunds) {
    async_fixture f;
    f.only({"charge.dispute.created", "charge.dispute.closed"});
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("ach-dispute", "pm_usBankAccount_dispute"));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        BOOST_TEST_REQUIRE(co_await f.settled());  // succeeds, then its charge is disputed
        BOOST_TEST_REQUIRE(f.fake->disputes().size() == 1u);
        auto ch = o.intent->latest_charge;
        auto r = co_await c->call("POST", "/v1/refunds", "charge=" + ch, "refund-disputed");
        BOOST_TEST_REQUIRE(r.error.has_value());
        BOOST_TEST(r.error->code == "charge_disputed");
        BOOST_TEST(f.fake->open_dispute(ch).empty());  // one at a time
        BOOST_TEST(f.fake->close_dispute(f.fake->disputes()[0].id, "lost"));
        BOOST_TEST(!f.fake->close_dispute(f.fake->disputes()[0].id, "won"));
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    auto t = f.hook.types();
    std::vector<std::string> want = {"charge.dispute.created", "charge.dispute.closed"};
    BOOST_TEST(t == want, boost::test_tools::per_element());
    BOOST_TEST(f.hook.hits[1].body.find("\"status\": \"lost\"") != std::string::npos);
}

// A refund that fails or is canceled afterwards, as Stripe reports it on the pinned API version:
// refund.updated and charge.refund.updated (there is no refund.failed), each carrying the refund object in
// its final status; the amount goes back to the charge (amount_refunded drops). A refund that has ended
// cannot end again.
BOOST_AUTO_TEST_CASE(a_refund_that_fails_or_is_canceled_gives_the_amount_back) {
    async_fixture f;
    f.only({"refund.created", "refund.updated", "refund.failed", "charge.refund.updated"});
    auto c = f.client();
    std::string ch, re1, re2;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("card-refund-fail", "pm_card_visa", 4200));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        ch = o.intent->latest_charge;
        auto r1 = co_await c->call("POST", "/v1/refunds", "charge=" + ch + "&amount=1000", "refund-f1");
        BOOST_TEST_REQUIRE(r1.http.resp.status == 200);
        re1 = field(r1.http.resp.body, "id");
        auto r2 = co_await c->call("POST", "/v1/refunds", "charge=" + ch + "&amount=700", "refund-f2");
        BOOST_TEST_REQUIRE(r2.http.resp.status == 200);
        re2 = field(r2.http.resp.body, "id");
        BOOST_TEST(f.fake->end_refund(re1, "failed"));
        BOOST_TEST(f.fake->end_refund(re2, "canceled"));
        BOOST_TEST(!f.fake->end_refund(re1, "canceled"));   // already ended
        BOOST_TEST(!f.fake->end_refund(re2, "succeeded"));  // not an end
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto charge = co_await c->retrieve_charge(ch);
        BOOST_TEST_REQUIRE(charge.has_value());
    });
    BOOST_TEST(f.fake->charges()[0].amount_refunded == 0);
    auto t = f.hook.types();
    std::vector<std::string> want = {"refund.created",        "refund.created", "refund.updated",
                                     "charge.refund.updated", "refund.updated", "charge.refund.updated"};
    BOOST_TEST(t == want, boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(f.hook.hits.size() == want.size());
    for (std::size_t i = 2; i < 4; ++i) {
        BOOST_TEST(f.hook.hits[i].body.find("\"id\": \"" + re1 + "\"") != std::string::npos);
        BOOST_TEST(f.hook.hits[i].body.find("\"status\": \"failed\"") != std::string::npos);
    }
    for (std::size_t i = 4; i < 6; ++i) {
        BOOST_TEST(f.hook.hits[i].body.find("\"id\": \"" + re2 + "\"") != std::string::npos);
        BOOST_TEST(f.hook.hits[i].body.find("\"status\": \"canceled\"") != std::string::npos);
    }
    for (const auto& h : f.hook.hits) BOOST_TEST(signed_by(h, secret));
}

// A chargeback runs needs_response → under_review → won with Stripe's events (funds withdrawn when opened,
// reinstated when won); an inquiry runs warning_needs_response → warning_under_review → warning_closed,
// withdraws nothing and leaves the payment refundable; an inquiry can escalate into a chargeback. Steps
// Stripe never takes are refused.
BOOST_AUTO_TEST_CASE(the_dispute_lifecycle_with_its_events) {
    async_fixture f;
    auto c = f.client();
    std::string dp, dq, de;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->create_payment_intent(pi_req("dispute-a", "pm_card_visa", 3000));
        auto b = co_await c->create_payment_intent(pi_req("dispute-b", "pm_card_visa", 2000));
        auto e = co_await c->create_payment_intent(pi_req("dispute-e", "pm_card_visa", 1000));
        BOOST_TEST_REQUIRE((a.intent && b.intent && e.intent));
        BOOST_TEST_REQUIRE(co_await f.settled());
        f.hook.hits.clear();
        dp = f.fake->open_dispute(a.intent->latest_charge);
        BOOST_TEST_REQUIRE(!dp.empty());
        BOOST_TEST(!f.fake->update_dispute(dp, "warning_under_review"));  // not a chargeback's step
        BOOST_TEST(f.fake->update_dispute(dp, "under_review"));
        BOOST_TEST(!f.fake->update_dispute(dp, "needs_response"));  // no way back
        BOOST_TEST(f.fake->update_dispute(dp, "won"));
        BOOST_TEST(!f.fake->update_dispute(dp, "lost"));  // closed

        dq = f.fake->open_dispute(b.intent->latest_charge, "general", 0, true);
        BOOST_TEST_REQUIRE(!dq.empty());
        BOOST_TEST(f.fake->disputes().back().status == "warning_needs_response");
        // An inquiry leaves the payment refundable; a chargeback does not.
        auto r = co_await c->call("POST", "/v1/refunds", "charge=" + b.intent->latest_charge + "&amount=500",
                                  "refund-during-inquiry");
        BOOST_TEST(r.http.resp.status == 200, r.http.resp.body);
        BOOST_TEST(f.fake->update_dispute(dq, "warning_under_review"));
        BOOST_TEST(!f.fake->close_dispute(dq, "won"));  // an inquiry is not won or lost
        BOOST_TEST(f.fake->close_dispute(dq, "warning_closed"));

        de = f.fake->open_dispute(e.intent->latest_charge, "fraudulent", 0, true);
        BOOST_TEST(f.fake->update_dispute(de, "needs_response"));  // escalated into a chargeback
        auto refused =
            co_await c->call("POST", "/v1/refunds", "charge=" + e.intent->latest_charge, "refund-e");
        BOOST_TEST(refused.http.resp.status == 400);
        BOOST_TEST_REQUIRE(refused.error.has_value());
        BOOST_TEST(refused.error->code == "charge_disputed");
        BOOST_TEST(f.fake->update_dispute(de, "lost"));
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto got = co_await c->call("GET", "/v1/disputes/" + dq, "", "");
        BOOST_TEST(field(got.http.resp.body, "status") == "warning_closed");
    });
    std::vector<std::pair<std::string, std::string>> seen;  // (type, dispute status) of each dispute event
    for (const auto& h : f.hook.hits) {
        if (!h.type.starts_with("charge.dispute.")) continue;
        simdjson::dom::parser p;
        std::string_view status;
        BOOST_TEST_REQUIRE(!p.parse(h.body).at_pointer("/data/object/status").get(status));
        seen.emplace_back(h.type, std::string(status));
    }
    std::vector<std::pair<std::string, std::string>> want = {
        {"charge.dispute.created", "needs_response"},
        {"charge.dispute.funds_withdrawn", "needs_response"},
        {"charge.dispute.updated", "under_review"},
        {"charge.dispute.closed", "won"},
        {"charge.dispute.funds_reinstated", "won"},
        {"charge.dispute.created", "warning_needs_response"},
        {"charge.dispute.updated", "warning_under_review"},
        {"charge.dispute.closed", "warning_closed"},
        {"charge.dispute.created", "warning_needs_response"},
        {"charge.dispute.updated", "needs_response"},
        {"charge.dispute.funds_withdrawn", "needs_response"},
        {"charge.dispute.closed", "lost"},
    };
    BOOST_TEST_REQUIRE(seen.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        BOOST_TEST(seen[i].first == want[i].first, i);
        BOOST_TEST(seen[i].second == want[i].second, i);
    }
}

// A Charges-API charge from a customer whose default source is a bank account is an ACH debit: 200 with a
// `pending` charge whose payment_method_details.type is ach_debit, then charge.succeeded or charge.failed.
BOOST_AUTO_TEST_CASE(a_charges_api_bank_debit_answers_pending_then_settles) {
    async_fixture f;
    f.fake->default_source("cus_ach", "ba_1FakeBankAccount");
    f.fake->default_source("cus_ach_nsf", "ba_1FakeBankAccountNsf");
    f.fake->bank_outcome("cus_ach_nsf", "failed", "insufficient_funds");
    f.fake->settle_after(std::chrono::hours(1));
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto ok = co_await c->create_charge(test::charge_req("ach-charge-ok", "cus_ach", 5100));
        auto nsf = co_await c->create_charge(test::charge_req("ach-charge-nsf", "cus_ach_nsf", 5200));
        BOOST_TEST(ok.in_flight_status == "pending", ok.message);  // accepted: in flight, not yet paid
        BOOST_TEST_REQUIRE((ok.charge.has_value() && nsf.charge.has_value()));
        BOOST_TEST(ok.charge->status == "pending");
        BOOST_TEST(!ok.charge->paid);
        BOOST_TEST(ok.charge->payment_method_type == "ach_debit");
        BOOST_TEST(stripe::bank_debit(ok.charge->payment_method_type));
        BOOST_TEST(f.fake->pending_settlements() == 2);
        BOOST_TEST(f.fake->settle_charge(ok.charge->id, "succeeded"));
        BOOST_TEST(f.fake->settle_charge(nsf.charge->id, "failed", "insufficient_funds"));
        BOOST_TEST(!f.fake->settle_charge(ok.charge->id, "failed"));  // no longer pending
        BOOST_TEST_REQUIRE(co_await f.fake->webhooks().wait([&] { return f.fake->webhooks().idle(); }, 10s));
        auto a = co_await c->retrieve_charge(ok.charge->id);
        auto b = co_await c->retrieve_charge(nsf.charge->id);
        BOOST_TEST_REQUIRE((a.has_value() && b.has_value()));
        BOOST_TEST(a->status == "succeeded");
        BOOST_TEST(a->paid);
        BOOST_TEST(b->status == "failed");
        BOOST_TEST(b->failure_code == "insufficient_funds");
    });
    std::vector<std::string> want = {"charge.pending", "charge.pending", "charge.succeeded", "charge.failed"};
    BOOST_TEST(f.hook.types() == want, boost::test_tools::per_element());
    BOOST_TEST(f.hook.hits[0].body.find("\"type\": \"ach_debit\"") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
