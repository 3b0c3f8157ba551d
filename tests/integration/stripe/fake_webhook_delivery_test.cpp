// fake-stripe's webhook deliveries (fake_async_fixture.hpp): a non-2xx answer retried with backoff then given
// up, an event delivered twice, a later event first, signatures under secret rotation and clock skew, and
// events rendered in the endpoint's API version.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "tests/integration/stripe/fake_async_fixture.hpp"

BOOST_AUTO_TEST_SUITE(fake_async)

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
