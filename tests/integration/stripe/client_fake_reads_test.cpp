// stripe::client ↔ fake-stripe over TLS (fake_fixture.hpp): PaymentIntents created, confirmed and retrieved
// (no return_url needed on the pinned version), lists paged and searched by billing key, and a key older
// than Stripe's 24 h starting a new request.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <thread>
#include <vector>

#include "fake_fixture.hpp"
#include "http/server.hpp"
#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "stripe/error.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::cert;
using cg::test::charge_into;
using cg::test::charge_req;
using cg::test::cls;
using cg::test::run_async;
using stripe::outcome_class;

namespace {

using fixture = test::fake_stripe_fixture;

}  // namespace

BOOST_AUTO_TEST_SUITE(client_fake)

BOOST_AUTO_TEST_CASE(payment_intent_and_retrieval) {
    fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        stripe::payment_intent_request p;
        p.amount = 1500;
        p.currency = "usd";
        p.customer = "cus_ok";
        p.payment_method = "pm_card_visa";
        p.metadata = {{"billing_key", "pi-key"}};
        p.idempotency_key = "pi-1";
        auto o = co_await c->create_payment_intent(p);
        BOOST_TEST(cls(o.cls) == "succeeded", o.message);
        BOOST_TEST(o.payment_intent_id.starts_with("pi_"));
        BOOST_TEST(o.charge_id.starts_with("ch_"));
        auto pi = co_await c->retrieve_payment_intent(o.payment_intent_id);
        BOOST_TEST_REQUIRE(pi.has_value());
        BOOST_TEST(pi->status == "succeeded");
        BOOST_TEST(pi->latest_charge == o.charge_id);
        auto ch = co_await c->retrieve_charge(o.charge_id);
        BOOST_TEST_REQUIRE(ch.has_value());
        BOOST_TEST(ch->payment_intent == o.payment_intent_id);
        BOOST_TEST(stripe::metadata_value(ch->metadata, "billing_key").value_or("") == "pi-key");
        auto missing = co_await c->retrieve_charge("ch_nope");
        BOOST_TEST(missing.code() == make_error_code(stripe::errc::rejected));
    });
}

// Since API version 2023-08-16 an intent without payment_method_types accepts the Dashboard's payment
// methods, redirect-based ones included, and Stripe refuses to confirm it without a return_url. The request
// chargeguard sent before (confirm + off_session + payment_method only) is refused on the pinned version and
// taken on an older one; the request it sends now (automatic payment methods, redirects never) is taken on
// both, for a card and for a bank debit.
BOOST_AUTO_TEST_CASE(a_confirmed_intent_needs_no_return_url_on_the_pinned_version) {
    fixture f;
    auto pinned = f.client();
    auto old_cfg = f.config();
    old_cfg.stripe_version = "2023-02-16";
    auto older = f.client(old_cfg);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        const std::string before =
            "amount=900&currency=usd&customer=cus_ok&payment_method=pm_card_visa&confirm=true&off_session="
            "true";
        auto refused = co_await pinned->call("POST", "/v1/payment_intents", before, "pi-before-pinned");
        BOOST_TEST(refused.http.resp.status == 400);
        BOOST_TEST_REQUIRE(refused.error.has_value());
        BOOST_TEST(refused.error->type == "invalid_request_error");
        BOOST_TEST(refused.error->message.find("return_url") != std::string::npos, refused.error->message);
        auto taken = co_await older->call("POST", "/v1/payment_intents", before, "pi-before-older");
        BOOST_TEST(taken.http.resp.status == 200, taken.message);

        for (auto* c : {pinned.get(), older.get()}) {
            for (const char* pm : {"pm_card_visa", "pm_usBankAccount_success"}) {
                stripe::payment_intent_request p;
                p.amount = 1100;
                p.currency = "usd";
                p.customer = "cus_ok";
                p.payment_method = pm;
                p.idempotency_key = std::string("pi-now-") + pm + (c == pinned.get() ? "-pinned" : "-older");
                auto o = co_await c->create_payment_intent(p);
                BOOST_TEST(cls(o.cls) == "succeeded", pm << ": " << o.message);
                BOOST_TEST(o.payment_intent_id.starts_with("pi_"), pm);
            }
        }
        // A bank debit under an explicit card-only list is refused as Stripe refuses it.
        auto card_only = co_await pinned->call(
            "POST", "/v1/payment_intents",
            "amount=900&currency=usd&customer=cus_ok&payment_method=pm_usBankAccount_success"
            "&payment_method_types[]=card&confirm=true&off_session=true",
            "pi-card-only");
        BOOST_TEST(card_only.http.resp.status == 400);
        BOOST_TEST_REQUIRE(card_only.error.has_value());
        BOOST_TEST(card_only.error->code == "payment_intent_incompatible_payment_method");
    });
}

BOOST_AUTO_TEST_CASE(list_pages_and_find_by_billing_key) {
    fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 7; ++i)
            (void)co_await c->create_charge(charge_req("bk-" + std::to_string(i), "cus_a"));
        (void)co_await c->create_charge(charge_req("bk-other", "cus_b"));
        stripe::list_charges_request q;
        q.customer = "cus_a";
        q.limit = 3;
        auto p1 = co_await c->list_charges(q);
        BOOST_TEST_REQUIRE(p1.has_value());
        BOOST_TEST(p1->data.size() == 3u);
        BOOST_TEST(p1->has_more);
        BOOST_TEST(stripe::metadata_value(p1->data[0].metadata, "billing_key").value_or("") ==
                   "bk-6");  // newest first
        q.starting_after = p1->data.back().id;
        auto p2 = co_await c->list_charges(q);
        BOOST_TEST_REQUIRE(p2.has_value());
        BOOST_TEST(stripe::metadata_value(p2->data[0].metadata, "billing_key").value_or("") == "bk-3");
        // The oldest needs three pages of two.
        auto found = co_await c->find_charge_by_billing_key("cus_a", "bk-0", std::nullopt, 2);
        BOOST_TEST_REQUIRE(found.has_value());
        BOOST_TEST_REQUIRE(found->has_value());
        BOOST_TEST(stripe::metadata_value((*found)->metadata, "billing_key").value_or("") == "bk-0");
        auto other = co_await c->find_charge_by_billing_key("cus_a", "bk-other", std::nullopt, 2);
        BOOST_TEST_REQUIRE(other.has_value());
        BOOST_TEST(!other->has_value());  // another customer's charge
    });
    BOOST_TEST(f.fake->requests() >= 8u + 2u + 4u);
}

BOOST_AUTO_TEST_CASE(key_older_than_24h_starts_a_new_request) {
    fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto a = co_await c->create_charge(charge_req("old-key"));
        auto since = f.fake->now();
        f.fake->advance_clock(std::chrono::hours(24));
        auto b = co_await c->create_charge(charge_req("old-key"));
        BOOST_TEST(cls(b.cls) == "succeeded");
        BOOST_TEST(!b.replayed);
        BOOST_TEST(b.charge_id != a.charge_id);
        // created[gte] filters: only the charge made on the moved clock.
        stripe::list_charges_request q;
        q.customer = "cus_ok";
        q.created_gte = since + 3600;
        auto page = co_await c->list_charges(q);
        BOOST_TEST_REQUIRE(page.has_value());
        BOOST_TEST_REQUIRE(page->data.size() == 1u);
        BOOST_TEST(page->data[0].id == b.charge_id);
    });
    BOOST_TEST(f.fake->charges().size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
