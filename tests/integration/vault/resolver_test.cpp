// What the proxy and its resolver make of Stripe's answers that say nothing final about a reservation (409 in
// use, 429, a key used with other parameters), and how the resolver's search finds PaymentIntents: real
// PostgreSQL and fake-stripe over TLS (fixture.hpp). Payments that settle later and refunds are
// resolver_settle_later_test.cpp.
#include <boost/test/unit_test.hpp>

#include "tests/integration/vault/fixture.hpp"
#include "vault/policy.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;
namespace {

std::string tagged_charge_body(std::int64_t amount, const std::string& customer, const std::string& idem) {
    return vault::with_vault_tag(vault_fixture::charge_body(amount, customer), idem);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vault_resolver)

BOOST_AUTO_TEST_CASE(the_owner_answered_409_in_use_keeps_its_reservation_counted_until_a_replay_settles_it) {
    // The owner's request reaches Stripe while another request with its key is executing there (a client's
    // retry that got there first): 409 idempotency_key_in_use. That other request may charge: the row stays
    // counted (uncertain), it is not released.
    vault_fixture f;
    auto k = f.issue(1000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().in_use = 1;
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(700), "in-use"));
    BOOST_TEST(r.status == 409);  // Stripe's answer, relayed
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'in-use'") == "uncertain");
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 700);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(700), "no-room")).status == 402);
    // The resolver replays under the key: Stripe executes it once.
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    auto charge = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::string> {
        co_return fk->charges().empty() ? std::string() : fk->charges().front().id;
    }(f.fake.get()));
    BOOST_TEST_REQUIRE(!charge.empty());
    BOOST_TEST(row_of(f, "in-use") == "settled:" + charge);
    BOOST_TEST(f.fake_charges() == 1u);
}

BOOST_AUTO_TEST_CASE(a_replay_answered_429_or_409_is_deferred_and_never_released) {
    // 429 runs before idempotency and 409 means another request with the key is executing: neither says what
    // became of the row's request. The row keeps counting and is tried again later.
    vault_fixture f;
    auto k = f.issue(10'000);
    f.put_row(k.id, "defer-me", 800, "/v1/charges", tagged_charge_body(800, "cus_vault", "defer-me"),
              "cus_vault");
    auto attempts = [&f] {
        return f.count("SELECT resolve_attempts FROM vault_spend WHERE idempotency_key = 'defer-me'");
    };
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().rate_limit = 100;  // more than the resolver's client retries
        co_return;
    }(f.fake.get()));
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'defer-me'") == "uncertain");
    BOOST_TEST(
        f.scalar("SELECT last_error FROM vault_spend WHERE idempotency_key = 'defer-me'").find("429") !=
        std::string::npos);
    BOOST_TEST(attempts() == 1);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().rate_limit = 0;
        fk->faults().in_use = 100;
        co_return;
    }(f.fake.get()));
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'defer-me'") == "uncertain");
    BOOST_TEST(
        f.scalar("SELECT last_error FROM vault_spend WHERE idempotency_key = 'defer-me'").find("409") !=
        std::string::npos);
    BOOST_TEST(attempts() == 2);
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 800);
    BOOST_TEST(f.fake_charges() == 0u);
    // Stripe answers again: the replay executes it once and settles it.
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().in_use = 0;
        co_return;
    }(f.fake.get()));
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'defer-me'") == "settled");
    BOOST_TEST(f.fake_charges() == 1u);
}

BOOST_AUTO_TEST_CASE(a_row_past_the_replay_window_is_searched_never_replayed) {
    // consume gives an uncertain key up after its quiet period (no sign of life from a call under it),
    // searches, finds nothing and charges under a new key generation. The resolver's replay is a call consume
    // does not see: past the replay window it must not execute the stored request, which would be a second
    // payment; it searches instead. A row inside the window is still replayed.
    vault_fixture f;
    auto k = f.issue(10'000);
    auto age = [&f](const std::string& idem, int seconds) {
        f.scalar("UPDATE vault_spend SET reserved_at = now() - make_interval(secs => " +
                 std::to_string(seconds) + ") WHERE idempotency_key = '" + idem + "' RETURNING 1");
    };
    f.put_row(k.id, "given-up", 800, "/v1/charges", tagged_charge_body(800, "cus_vault", "given-up"),
              "cus_vault");
    age("given-up", 151);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.fake_charges() == 0u, "a request was executed after the client may have given its key up");
    BOOST_TEST(row_of(f, "given-up").starts_with("released"));
    BOOST_TEST(f.sink.contains("search found nothing tagged"));
    f.put_row(k.id, "in-time", 700, "/v1/charges", tagged_charge_body(700, "cus_vault", "in-time"),
              "cus_vault");
    age("in-time", 120);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.fake_charges() == 1u);
    BOOST_TEST(row_of(f, "in-time").starts_with("settled:ch_"));
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 700);
}

BOOST_AUTO_TEST_CASE(a_replay_answered_idempotency_error_is_looked_up_on_stripe_not_released) {
    // The key was used at Stripe with other parameters (here: a statement descriptor too): that request
    // executed and charged. Stripe answers the replay 400 idempotency_error; the search finds the charge by
    // its tag.
    vault_fixture f;
    auto k = f.issue(10'000);
    auto body = tagged_charge_body(600, "cus_vault", "other-params");
    auto direct = f.direct_stripe();
    auto first =
        f.run(direct->call("POST", "/v1/charges", body + "&statement_descriptor=OTHER", "other-params"));
    BOOST_TEST_REQUIRE(first.http.ok());
    BOOST_TEST_REQUIRE(first.http.resp.status == 200);
    auto charge = vault::object_id(first.http.resp.body).value_or("");
    f.put_row(k.id, "other-params", 600, "/v1/charges", body, "cus_vault");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(row_of(f, "other-params") == "settled:" + charge);
    BOOST_TEST(f.sink.contains("search found " + charge));  // not the replay's answer: Stripe refused it
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 600);
    BOOST_TEST(f.fake_charges() == 1u);
}

BOOST_AUTO_TEST_CASE(the_search_finds_payment_intents_that_made_no_charge_and_releases_canceled_ones) {
    // Three PaymentIntents, each created at Stripe and answered with a saved 500 (fail_after_create): the
    // resolver's replay gets the 500 again and searches. None made a charge, so only the customer's
    // PaymentIntents can tell: requires_action (3-D Secure, on-session) and requires_confirmation can still
    // move money and keep counting (settled with the intent); the canceled one is released.
    vault_fixture f;
    auto k = f.issue(100'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_3ds", {"authentication_required", "authentication_required"});
        fk->faults().fail_after_create = 3;
        fk->faults().fault_path = "/v1/payment_intents";
        co_return;
    }(f.fake.get()));
    auto pi = [&](const std::string& idem, const std::string& extra) {
        auto r =
            f.send(f.post(k.secret, "/v1/payment_intents",
                          f.charge_body(1000, "cus_3ds") + "&payment_method=pm_card_visa" + extra, idem));
        BOOST_TEST(r.status == 500, idem);
    };
    pi("pi-action",
       "&automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never&confirm="
       "true");         // on-session: stops at requires_action
    pi("pi-open", "");  // not confirmed: requires_confirmation
    pi("pi-cancel", "");
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state = 'uncertain'") == 3);
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 3u);
    BOOST_TEST(intents[0].status == "requires_action");
    BOOST_TEST(intents[1].status == "requires_confirmation");
    BOOST_TEST(f.fake_charges() == 0u);
    // Another caller of the account cancels the third.
    auto direct = f.direct_stripe();
    auto cancel = f.run(direct->call("POST", "/v1/payment_intents/" + intents[2].id + "/cancel",
                                     "cancellation_reason=abandoned", "cancel-pi"));
    BOOST_TEST_REQUIRE(cancel.http.ok());
    BOOST_TEST(cancel.http.resp.status == 200);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 3u);
    BOOST_TEST(row_of(f, "pi-action") == "settled:" + intents[0].id);
    BOOST_TEST(row_of(f, "pi-open") == "settled:" + intents[1].id);
    BOOST_TEST(row_of(f, "pi-cancel") == "released:");
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 2000);
    // A succeeded intent cannot be canceled, as at Stripe.
    auto again =
        f.run(direct->call("POST", "/v1/payment_intents/" + intents[2].id + "/cancel", "", "cancel-2"));
    BOOST_TEST_REQUIRE(again.http.ok());
    BOOST_TEST(again.http.resp.status == 400);
}

// An off-session PaymentIntent that was declined (requires_payment_method, the state a 402 leaves) moved
// nothing, and only a new confirm with another payment method — a request the cap does not govern — could:
// found by the search it is released, as the replay releases a 402 and as the ledger's settlement reads it
// (stripe/fact.hpp: failed).
BOOST_AUTO_TEST_CASE(the_search_releases_a_declined_payment_intent) {
    vault_fixture f;
    auto k = f.issue(100'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_broke", {"card_declined", "insufficient_funds"});
        fk->faults().fail_after_create = 1;
        fk->faults().fault_path = "/v1/payment_intents";
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/payment_intents",
                           f.charge_body(1000, "cus_broke") +
                               "&payment_method=pm_card_visa&automatic_payment_methods[enabled]=true"
                               "&automatic_payment_methods[allow_redirects]=never&confirm=true",
                           "pi-declined"));
    BOOST_TEST(r.status == 500);
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state = 'uncertain'") == 1);
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 1u);
    BOOST_TEST(intents[0].status == "requires_payment_method");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(row_of(f, "pi-declined") == "released:");
    BOOST_TEST(f.sink.contains("search found requires_payment_method PaymentIntent " + intents[0].id));
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 0);
}

BOOST_AUTO_TEST_CASE(a_body_that_only_spells_the_tag_in_a_value_is_replayed_not_searched) {
    // An abandoned `reserved` row whose body mentions the tag inside another parameter's value carries no
    // tag as Stripe reads it: a search could never find its charge (and would release a charge that
    // happened). The resolver replays it instead: Stripe returns what it saved.
    vault_fixture f(false);
    auto c = f.proxy_config();
    c.stale_reserved = 200ms;
    f.start(c);
    auto k = f.issue(10'000);
    std::string body =
        "amount=500&currency=usd&customer=cus_spoof&description=metadata[cg_vault_idempotency_key]";
    auto direct = f.direct_stripe();
    auto first = f.run(direct->call("POST", "/v1/charges", body, "spelled"));
    BOOST_TEST_REQUIRE(first.http.ok());
    BOOST_TEST_REQUIRE(first.http.resp.status == 200);
    auto charge = vault::object_id(first.http.resp.body).value_or("");
    f.put_row(k.id, "spelled", 500, "/v1/charges", body, "cus_spoof", false);
    f.pause(400ms);  // abandoned: untouched for longer than stale_reserved
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(row_of(f, "spelled") == "settled:" + charge);
    BOOST_TEST(f.fake_charges() == 1u);
}

// The search's settle of a payment still in flight follows it like the proxy's own answer does: a bank
// debit PaymentIntent found processing and a Charges-API debit found pending (each created at Stripe and
// answered with a saved 500, so the replay searches) are settled in flight; when the bank fails them the
// resolver releases both, their room back once.
BOOST_AUTO_TEST_CASE(the_search_follows_a_payment_it_finds_in_flight_and_releases_it_when_it_fails) {
    vault_fixture f;
    auto k = f.issue(10'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->settle_after(std::chrono::hours(1));  // the test settles the debits by hand
        fk->faults().fail_after_create = 2;
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/payment_intents",
                           f.charge_body(3000) +
                               "&payment_method=pm_usBankAccount_processing&confirm=true&automatic_payment_"
                               "methods[enabled]=true&automatic_payment_methods[allow_redirects]=never",
                           "found-processing"));
    BOOST_TEST(r.status == 500, r.body);
    r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000) + "&source=ba_debit", "found-pending"));
    BOOST_TEST(r.status == 500, r.body);
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state = 'uncertain'") == 2);
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    BOOST_TEST(committed() == 5000);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 2u);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'found-processing' AND "
                       "state = 'settled' AND settled_status = 'processing'") == 1);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'found-pending' AND "
                       "state = 'settled' AND settled_status = 'pending'") == 1);
    BOOST_TEST(committed() == 5000);
    auto ids = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::pair<std::string, std::string>> {
        co_return std::pair(fk->intents().empty() ? std::string() : fk->intents().front().id,
                            fk->charges().empty() ? std::string() : fk->charges().back().id);
    }(f.fake.get()));
    auto failed = f.run([](fake::fake_stripe* fk, std::string pi, std::string ch) -> net::awaitable<bool> {
        co_return fk->settle(pi, "failed", "insufficient_funds") &&
            fk->settle_charge(ch, "failed", "account_closed");
    }(f.fake.get(), ids.first, ids.second));
    BOOST_TEST_REQUIRE(failed);
    f.scalar("UPDATE vault_spend SET reserved_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 2u);
    BOOST_TEST(row_of(f, "found-processing") == "released:" + ids.first);
    BOOST_TEST(row_of(f, "found-pending") == "released:" + ids.second);
    BOOST_TEST(committed() == 0);
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 0u);
    BOOST_TEST(committed() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
