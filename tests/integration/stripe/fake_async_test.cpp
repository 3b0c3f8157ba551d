// fake-stripe's payments that settle later, refunds, disputes and signed webhook deliveries, driven through
// stripe::client over TLS, with a webhook endpoint (http::server) on the test's io_context. Every wait is on
// an event (webhook_sender::wait), never a sleep.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <deque>

#include "fake_fixture.hpp"
#include "http/proto/message.hpp"
#include "http/router.hpp"
#include "http/server.hpp"
#include "stripe/types.hpp"
#include "stripe/webhook_signature.hpp"
#include "support/run_async.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::run_async;

namespace {

const std::string secret = "whsec_fake_async_current";
const std::string previous = "whsec_fake_async_previous";

// A webhook endpoint that records every delivery and answers the queued statuses (then 200).
struct endpoint {
    struct hit {
        std::string signature, body, content_type, user_agent, event_id, type;
    };
    std::unique_ptr<http::server> server;
    std::vector<hit> hits;
    std::deque<int> answers;
    std::uint16_t port = 0;

    explicit endpoint(asio::io_context& io) {
        http::router r;
        r.add("POST", "/hooks", [this](http::request& q) -> asio::awaitable<http::response> {
            hit h;
            h.signature = std::string(q.headers.get("Stripe-Signature").value_or(""));
            h.content_type = std::string(q.headers.get("Content-Type").value_or(""));
            h.user_agent = std::string(q.headers.get("User-Agent").value_or(""));
            h.body = q.body;
            simdjson::dom::parser p;
            auto doc = p.parse(h.body);
            std::string_view id, type;
            if (!doc.error() && !doc["id"].get(id) && !doc["type"].get(type)) {
                h.event_id = std::string(id);
                h.type = std::string(type);
            }
            hits.push_back(std::move(h));
            int status = 200;
            if (!answers.empty()) {
                status = answers.front();
                answers.pop_front();
            }
            co_return http::make_response(status, "");
        });
        server =
            std::make_unique<http::server>(io.get_executor(), std::move(r), http::server_options{}, logger());
        auto ep = server->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        port = ep->port();
        server->start();
    }
    ~endpoint() { server->stop(); }

    std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/hooks"; }
    std::vector<std::string> types() const {
        std::vector<std::string> t;
        for (const auto& h : hits) t.push_back(h.type);
        return t;
    }
};

struct async_fixture : test::fake_stripe_fixture {
    endpoint hook{io};
    async_fixture() {
        fake::webhook_endpoint e;
        e.url = hook.url();
        e.secrets = {secret};
        e.retry_base_ms = 5;
        e.retry_max_ms = 20;
        e.max_attempts = 4;
        e.timeout_ms = 2000;
        fake->webhooks().configure(e);
        fake->settle_after(30ms);
    }
    void only(std::vector<std::string> types) {
        auto e = fake->webhooks().endpoint();
        e.enabled_events = std::move(types);
        fake->webhooks().configure(e);
    }
    // Awaits: nothing outstanding, no settlement pending.
    asio::awaitable<bool> settled() {
        co_return co_await fake->webhooks().wait(
            [this] { return fake->webhooks().idle() && fake->pending_settlements() == 0; }, 10s);
    }
};

stripe::payment_intent_request pi_req(std::string key, std::string pm, std::int64_t amount = 4200) {
    stripe::payment_intent_request r;
    r.amount = amount;
    r.currency = "usd";
    r.customer = "cus_bank";
    r.payment_method = std::move(pm);
    r.metadata = {{"billing_key", key}};
    r.idempotency_key = std::move(key);
    return r;
}

bool signed_by(const endpoint::hit& h, const std::string& s) {
    std::vector<std::string> secrets{s};
    auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    return stripe::verify_signature(h.signature, h.body, secrets, now).ok();
}

std::string field(const std::string& json, std::string_view key) {
    simdjson::dom::parser p;
    auto doc = p.parse(json);
    std::string_view v;
    if (doc.error() || doc[key].get(v)) return {};
    return std::string(v);
}

}  // namespace

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

BOOST_AUTO_TEST_CASE(non_2xx_is_retried_with_backoff_then_given_up) {
    async_fixture f;
    f.only({"charge.succeeded"});
    f.hook.answers = {500, 503, 200};
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        co_await c->create_charge(test::charge_req("retry-1"));
        BOOST_TEST_REQUIRE(co_await f.settled());
        f.hook.answers = {500, 500, 500, 500, 500};
        co_await c->create_charge(test::charge_req("retry-2"));
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    const auto& d = f.fake->webhooks().deliveries();
    BOOST_TEST_REQUIRE(d.size() == 7u);
    BOOST_TEST(d[0].status == 500);
    BOOST_TEST(d[1].status == 503);
    BOOST_TEST(d[2].status == 200);
    BOOST_TEST(d[2].attempt == 3);
    BOOST_TEST(d[0].event_id == d[2].event_id);
    auto st = f.fake->webhooks().stats();
    BOOST_TEST(st.acked_events == 1u);
    BOOST_TEST(st.given_up == 1u);  // the second event: 4 attempts, all 500
    BOOST_TEST(d.back().attempt == 4);
}

BOOST_AUTO_TEST_CASE(duplicates_same_event_id_twice) {
    async_fixture f;
    f.only({"charge.succeeded"});
    f.fake->webhooks().faults().duplicate = 1;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        co_await c->create_charge(test::charge_req("dup-1"));
        co_await c->create_charge(test::charge_req("dup-2"));
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    BOOST_TEST_REQUIRE(f.hook.hits.size() == 3u);
    BOOST_TEST(f.hook.hits[0].event_id == f.hook.hits[1].event_id);
    BOOST_TEST(f.hook.hits[1].event_id != f.hook.hits[2].event_id);
    BOOST_TEST(f.fake->webhooks().deliveries()[1].duplicate);
    BOOST_TEST(f.fake->webhooks().stats().acked_events == 2u);
}

BOOST_AUTO_TEST_CASE(reordering_delivers_the_later_event_first) {
    async_fixture f;
    f.only({"payment_intent.processing", "payment_intent.succeeded"});
    f.fake->webhooks().faults().reorder = 1;  // the processing event waits behind the succeeded one
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        co_await c->create_payment_intent(pi_req("ach-reorder", "pm_usBankAccount_success"));
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    std::vector<std::string> want = {"payment_intent.succeeded", "payment_intent.processing"};
    BOOST_TEST(f.hook.types() == want, boost::test_tools::per_element());
    BOOST_TEST(f.fake->webhooks().deliveries()[1].reordered);
    BOOST_TEST(f.fake->webhooks().stats().reordered == 1u);
}

BOOST_AUTO_TEST_CASE(rotation_signs_with_every_secret_and_skew_makes_stale) {
    async_fixture f;
    f.only({"charge.succeeded"});
    auto e = f.fake->webhooks().endpoint();
    e.secrets = {secret, previous};
    f.fake->webhooks().configure(e);
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        co_await c->create_charge(test::charge_req("rot-1"));
        BOOST_TEST_REQUIRE(co_await f.settled());
        f.fake->webhooks().faults().sign_skew_s = 3600;
        co_await c->create_charge(test::charge_req("rot-2"));
        BOOST_TEST_REQUIRE(co_await f.settled());
    });
    BOOST_TEST_REQUIRE(f.hook.hits.size() == 2u);
    const auto& h = f.hook.hits[0];
    BOOST_TEST(signed_by(h, secret));
    BOOST_TEST(signed_by(h, previous));
    auto parsed = stripe::parse_signature_header(h.signature);
    BOOST_TEST(parsed.header.v1.size() == 2u);
    BOOST_TEST(!signed_by(h, "whsec_someone_else"));
    auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    std::vector<std::string> secrets{secret};
    BOOST_TEST(
        stripe::to_string(
            stripe::verify_signature(f.hook.hits[1].signature, f.hook.hits[1].body, secrets, now).status) ==
        "stale");
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

// Requests Stripe refuses, with the code and param of its answer (built outside the coroutine: g++ 12
// mishandles braced lists of temporaries in coroutine frames).
struct refusal_row {
    std::string method, target, body, code, param;
};
std::vector<refusal_row> refusals(const std::string& charge) {
    return {
        {"GET", "/v1/charges?limit=10&colour=red", "", "parameter_unknown", "colour"},
        {"GET", "/v1/charges?limit=0", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/charges?limit=101", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/payment_intents?limit=ten", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/refunds?limit=1000", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/events?limit=-1", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/charges?created[since]=1", "", "parameter_unknown", "created[since]"},
        {"GET", "/v1/charges?created[gte]=yesterday", "", "parameter_invalid_integer", "created[gte]"},
        {"GET", "/v1/refunds?customer=cus_ok", "", "parameter_unknown", "customer"},
        {"GET", "/v1/events?object=charge", "", "parameter_unknown", "object"},
        {"GET", "/v1/charges/" + charge + "?customer=cus_ok", "", "parameter_unknown", "customer"},
        {"GET", "/v1/charges/search?query=customer:'cus_ok'&limit=101", "", "parameter_invalid_integer",
         "limit"},
        {"GET", "/v1/charges/search?limit=5", "", "parameter_missing", "query"},
        {"POST", "/v1/charges", "amount=100&currency=usd&customer=cus_ok&colour=red", "parameter_unknown",
         "colour"},
        {"POST", "/v1/charges", "amount=1e3&currency=usd&customer=cus_ok", "parameter_invalid_integer",
         "amount"},
        {"POST", "/v1/charges", "amount=0&currency=usd&customer=cus_ok", "parameter_invalid_integer",
         "amount"},
        {"POST", "/v1/charges", "amount=100000000&currency=usd&customer=cus_ok", "amount_too_large",
         "amount"},
        {"POST", "/v1/charges",
         "amount=100&currency=usd&customer=cus_ok&description=", "parameter_invalid_empty", "description"},
        {"POST", "/v1/refunds", "charge=" + charge + "&amount=x", "parameter_invalid_integer", "amount"},
        {"POST", "/v1/refunds", "charge=" + charge + "&reason=", "parameter_invalid_empty", "reason"},
        {"POST", "/v1/payment_intents/pi_1Missing/cancel", "reason=abandoned", "parameter_unknown", "reason"},
    };
}

std::vector<std::string> accepted_reads(const std::string& charge) {
    return {"/v1/charges?limit=1", "/v1/charges?limit=100&created[gte]=0&customer=cus_ok",
            "/v1/events?types[]=charge.succeeded&types[]=charge.failed&limit=3",
            "/v1/refunds?charge=" + charge + "&limit=100",
            "/v1/charges/" + charge + "?expand[]=payment_intent"};
}

// What Stripe refuses, fake-stripe refuses with Stripe's codes: unknown parameters on every endpoint (GET
// filters included), `limit` outside 1..100, integers that are not, empty strings, an amount too large.
BOOST_AUTO_TEST_CASE(unknown_parameters_and_out_of_range_values_are_refused_as_stripe_refuses_them) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_charge(test::charge_req("refusals-base"));
        BOOST_TEST_REQUIRE(o.charge.has_value());
        const auto rows = refusals(o.charge->id);
        int n = 0;
        for (const auto& r : rows) {
            std::string key;  // a named value: g++ 12 mishandles a conditional's temporary in a co_await
            if (r.method == "POST") key = "refusal-" + std::to_string(++n);
            auto got = co_await c->call(r.method, r.target, r.body, key);
            BOOST_TEST(got.http.resp.status == 400, r.target << " " << r.body);
            BOOST_TEST_REQUIRE(got.error.has_value(), r.target);
            BOOST_TEST(got.error->type == "invalid_request_error", r.target);
            BOOST_TEST(got.error->code == r.code, r.target << " " << r.body << ": " << got.http.resp.body);
            BOOST_TEST(got.http.resp.body.find("\"param\":\"" + r.param + "\"") != std::string::npos,
                       got.http.resp.body);
        }
        // The same parameters within range are taken.
        const auto reads = accepted_reads(o.charge->id);
        for (const auto& target : reads) {
            auto got = co_await c->call("GET", target, "", "");
            BOOST_TEST(got.http.resp.status == 200, target << ": " << got.http.resp.body);
        }
        auto events = co_await c->call("GET", "/v1/events?types[]=charge.succeeded&limit=3", "", "");
        BOOST_TEST(events.http.resp.body.find("charge.succeeded") != std::string::npos);
    });
}

// GET /v1/charges/search and /v1/payment_intents/search: metadata['k']:'v', customer:'cus_…' and AND, in
// Stripe's search_result shape, newest first, paged by next_page; a field Stripe cannot search is refused.
BOOST_AUTO_TEST_CASE(search_by_metadata_and_customer) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 3; ++i) {
            auto r = test::charge_req("search-" + std::to_string(i), i == 2 ? "cus_other" : "cus_ok");
            r.metadata = {{"billing_key", "bk-search"}, {"n", std::to_string(i)}};
            co_await c->create_charge(r);
        }
        co_await c->create_payment_intent(pi_req("search-pi", "pm_card_visa"));
        auto q = [&](std::string query, std::string extra = {}) {
            return c->call("GET", "/v1/charges/search?query=" + http::url_encode(query) + extra, "", "");
        };
        auto all = co_await q("metadata['billing_key']:'bk-search'");
        BOOST_TEST(all.http.resp.status == 200, all.http.resp.body);
        simdjson::dom::parser p;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(!p.parse(all.http.resp.body).get(doc));
        BOOST_TEST(std::string_view(doc["object"].get_string().value()) == "search_result");
        BOOST_TEST(doc["data"].get_array().size() == 3u);
        BOOST_TEST(doc["next_page"].is_null());
        BOOST_TEST(std::string_view(doc["url"].get_string().value()) == "/v1/charges/search");

        auto mine = co_await q("metadata['billing_key']:'bk-search' AND customer:'cus_ok'", "&limit=1");
        BOOST_TEST_REQUIRE(!p.parse(mine.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 1u);
        BOOST_TEST(doc["has_more"].get_bool().value());
        std::string next(doc["next_page"].get_string().value());
        std::string first(doc.at_pointer("/data/0/metadata/n").get_string().value());
        BOOST_TEST(first == "1");  // newest first
        auto page2 =
            co_await q("metadata['billing_key']:'bk-search' AND customer:'cus_ok'", "&limit=1&page=" + next);
        BOOST_TEST_REQUIRE(!p.parse(page2.http.resp.body).get(doc));
        BOOST_TEST(std::string_view(doc.at_pointer("/data/0/metadata/n").get_string().value()) == "0");
        BOOST_TEST(!doc["has_more"].get_bool().value());

        auto none = co_await q("metadata['billing_key']:'bk-nowhere'");
        BOOST_TEST_REQUIRE(!p.parse(none.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 0u);

        auto bad_field = co_await q("colour:'red'");
        BOOST_TEST(bad_field.http.resp.status == 400);
        auto bad_syntax = co_await q("customer:'cus_ok' OR customer:'cus_other'");
        BOOST_TEST(bad_syntax.http.resp.status == 400);

        auto pis = co_await c->call(
            "GET",
            "/v1/payment_intents/search?query=" + http::url_encode("metadata['billing_key']:'search-pi'"), "",
            "");
        BOOST_TEST_REQUIRE(!p.parse(pis.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 1u);
        BOOST_TEST(std::string_view(doc.at_pointer("/data/0/object").get_string().value()) ==
                   "payment_intent");
    });
}

// Events reach the webhook endpoint rendered in the endpoint's API version: on 2022-08-01 (before
// latest_charge existed) the PaymentIntent carries its charges as a list and the event says that version;
// GET /v1/events shows the account's default version (2024-06-20) with latest_charge. A request's
// Stripe-Version renders the objects it answers the same way.
BOOST_AUTO_TEST_CASE(webhook_events_are_rendered_in_the_endpoint_api_version) {
    async_fixture f;
    f.only({"payment_intent.succeeded"});
    auto e = f.fake->webhooks().endpoint();
    e.api_version = "2022-08-01";
    f.fake->webhooks().configure(e);
    auto c = f.client();
    auto old_cfg = f.config();
    old_cfg.stripe_version = "2022-08-01";
    auto older = f.client(old_cfg);
    std::string pi;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_payment_intent(pi_req("versioned-pi", "pm_card_visa"));
        BOOST_TEST_REQUIRE(o.intent.has_value());
        pi = o.intent->id;
        BOOST_TEST_REQUIRE(co_await f.settled());
        auto old_view = co_await older->call("GET", "/v1/payment_intents/" + pi, "", "");
        BOOST_TEST(old_view.http.resp.body.find("\"latest_charge\"") == std::string::npos);
        BOOST_TEST(old_view.http.resp.body.find("\"charges\":{\"object\":\"list\"") != std::string::npos);
        auto new_view = co_await c->call("GET", "/v1/payment_intents/" + pi, "", "");
        BOOST_TEST(new_view.http.resp.body.find("\"latest_charge\":\"ch_") != std::string::npos);
    });
    BOOST_TEST_REQUIRE(f.hook.hits.size() == 1u);
    const auto& sent = f.hook.hits[0].body;
    BOOST_TEST(sent.find("\"api_version\": \"2022-08-01\"") != std::string::npos, sent);
    BOOST_TEST(sent.find("\"latest_charge\"") == std::string::npos, sent);
    BOOST_TEST(sent.find("\"charges\": {") != std::string::npos, sent);
    const auto& stored = f.fake->events().back().body;
    BOOST_TEST(stored.find("\"api_version\": \"2024-06-20\"") != std::string::npos, stored);
    BOOST_TEST(stored.find("\"latest_charge\": \"ch_") != std::string::npos, stored);
    BOOST_TEST(stored.find("\"charges\"") == std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
