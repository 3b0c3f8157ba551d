// fake-stripe's payments that settle later, refunds, disputes and signed webhook deliveries, driven through
// stripe::client over TLS, with a webhook endpoint (http::server) on the test's io_context. Every wait is on
// an event (webhook_sender::wait), never a sleep.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <deque>

#include "fake_fixture.hpp"
#include "http/router.hpp"
#include "http/server.hpp"
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

// A refund that fails or is canceled afterwards, as Stripe reports it: refund.updated, refund.failed (for a
// failure) and charge.refund.updated, each carrying the refund object in its final status; the amount goes
// back to the charge (amount_refunded drops). A refund that has ended cannot end again.
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
    std::vector<std::string> want = {"refund.created",       "refund.created",        "refund.updated",
                                     "refund.failed",        "charge.refund.updated", "refund.updated",
                                     "charge.refund.updated"};
    BOOST_TEST(t == want, boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(f.hook.hits.size() == want.size());
    for (std::size_t i = 2; i < 5; ++i) {
        BOOST_TEST(f.hook.hits[i].body.find("\"id\": \"" + re1 + "\"") != std::string::npos);
        BOOST_TEST(f.hook.hits[i].body.find("\"status\": \"failed\"") != std::string::npos);
    }
    for (std::size_t i = 5; i < 7; ++i) {
        BOOST_TEST(f.hook.hits[i].body.find("\"id\": \"" + re2 + "\"") != std::string::npos);
        BOOST_TEST(f.hook.hits[i].body.find("\"status\": \"canceled\"") != std::string::npos);
    }
    for (const auto& h : f.hook.hits) BOOST_TEST(signed_by(h, secret));
}

BOOST_AUTO_TEST_SUITE_END()
