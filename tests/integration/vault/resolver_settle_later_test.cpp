// What the resolver makes of payments that settle later (real PostgreSQL and fake-stripe over TLS,
// fixture.hpp): a reservation settled while its payment was still in flight keeps counting until Stripe says
// how it ended, a bank debit through the proxy is held while processing, and a refund gives cap room back
// only under the key's policy. The cap accounting stays exact at every step.
#include <boost/test/unit_test.hpp>

#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(vault_resolver)

// Payments that settle later: a reservation settled while its PaymentIntent was still in flight keeps
// counting until Stripe says how it ended. The intent canceled (the authorisation lapsed; a failed bank debit
// returns it to requires_payment_method alike) → released, the cap room back exactly once; succeeded →
// settled for good; still open → counted, checked again later. The cap accounting stays exact:
// committed_cents equals the sum the trigger keeps, at every step.
BOOST_AUTO_TEST_CASE(a_payment_that_fails_after_processing_releases_its_reservation) {
    vault_fixture f;
    auto k = f.issue(5000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_3ds", {"authentication_required", "authentication_required"});
        co_return;
    }(f.fake.get()));
    auto create = [&](const std::string& idem, const std::string& customer) {
        auto r = f.send(f.post(k.secret, "/v1/payment_intents",
                               f.charge_body(1500, customer) +
                                   "&payment_method=pm_card_visa&confirm=true&automatic_payment_methods["
                                   "enabled]=true&automatic_payment_methods[allow_redirects]=never",
                               idem));
        BOOST_TEST(r.status == 200, idem << ": " << r.body);
    };
    create("late-fail", "cus_3ds");  // on-session: requires_action, which the proxy follows
    create("late-ok", "cus_vault");  // succeeded: the test marks it as if Stripe had answered processing
    create("late-open", "cus_3ds");
    f.settle_now();
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    auto exact = [&] {
        return f.count(
                   "SELECT count(*) FROM vault_keys k WHERE id = '" + k.id +
                   "' AND committed_cents = (SELECT coalesce(sum(amount_cents - reopened_cents), 0) "
                   "FROM vault_spend s WHERE s.vault_key_id = k.id AND s.state IN ('reserved', 'settled', "
                   "'uncertain'))") == 1;
    };
    BOOST_TEST(committed() == 4500);
    // The proxy follows the two intents waiting for authentication itself, in a task of its own after
    // answering, with no completion to await: wait (bounded) for its writes.
    auto followed = [&](const std::string& idem) {
        return f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = '" + idem +
                       "' AND settled_status = 'requires_action'") == 1;
    };
    for (int i = 0; i < 500 && !(followed("late-fail") && followed("late-open")); ++i) f.pause(10ms);
    BOOST_TEST_REQUIRE(followed("late-fail"));
    BOOST_TEST_REQUIRE(followed("late-open"));
    auto marked = f.run(f.store->mark_in_flight(k.id, "late-ok", "processing"));
    BOOST_TEST_REQUIRE(marked.has_value());
    BOOST_TEST(*marked);
    // Due: their last check (none yet, so the reservation time) older than the resolver interval.
    f.scalar("UPDATE vault_spend SET reserved_at = now() - interval '1 hour' RETURNING 1");
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 3u);
    auto direct = f.direct_stripe();
    auto cancel = f.run(direct->call("POST", "/v1/payment_intents/" + intents[0].id + "/cancel",
                                     "cancellation_reason=abandoned", "cancel-late"));
    BOOST_TEST_REQUIRE(cancel.http.ok());
    BOOST_TEST(cancel.http.resp.status == 200);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 3u);
    BOOST_TEST(row_of(f, "late-fail") == "released:" + intents[0].id);
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'late-ok' AND state = 'settled' "
                "AND settled_status IS NULL") == 1);
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'late-open' AND state = "
                "'settled' AND settled_status = 'requires_action' AND in_flight_checked_at IS NOT NULL") ==
        1);
    BOOST_TEST(committed() == 3000);
    BOOST_TEST(exact());
    // Checked rows are not due again at once; a second pass, even when due, releases nothing twice.
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 0u);
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);  // late-open, still open
    BOOST_TEST(committed() == 3000);
    BOOST_TEST(exact());
    // The released room is usable again: a new 2000 fits under the 5000 cap only because 1500 came back.
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000), "after-release"));
    BOOST_TEST(r.status == 200, r.body);
    f.settle_now();
    BOOST_TEST(committed() == 5000);
    BOOST_TEST(exact());
}

// A refund does not give cap room back by default; under a key whose policy says so it does, once, by the
// refunded amount (cumulative: a smaller, older refund amount replayed changes nothing). The policy applies
// to what is refunded while it holds: room reopened under `true` stays reopened after `set-policy false`
// (the spend made in it is not turned into an overspend after the fact) and only later refunds stop
// reopening; refunds recorded under `false` stay closed after `true`, and later ones reopen.
BOOST_AUTO_TEST_CASE(a_refund_reopens_cap_room_only_under_the_keys_policy) {
    vault_fixture f;
    auto k = f.issue(3000);
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000), "refund-me"));
    BOOST_TEST_REQUIRE(r.status == 200);
    f.settle_now();
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    auto exact = [&] {
        return f.count(
                   "SELECT coalesce(sum(amount_cents - reopened_cents), 0) FROM vault_spend WHERE "
                   "vault_key_id = '" +
                   k.id + "' AND state IN ('reserved', 'settled', 'uncertain')") == committed();
    };
    auto policy = [&](bool reopen) {
        auto pol = f.run(f.store->set_refunds_reopen_cap(k.id, reopen));
        BOOST_TEST_REQUIRE(pol.has_value());
        BOOST_TEST(*pol);
    };
    auto refund = [&](std::int64_t cumulative) {
        auto given = f.run(f.store->apply_refund(k.id, "refund-me", cumulative));
        BOOST_TEST_REQUIRE(given.has_value());
        BOOST_TEST_REQUIRE(given->has_value());
        return **given;
    };
    BOOST_TEST(committed() == 2000);
    BOOST_TEST(refund(800) == 0);
    BOOST_TEST(committed() == 2000);  // default policy: the cap bounds what was charged
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(1500), "no-room")).status == 402);
    // false → true: the 800 refunded under false stays closed; the next 400 refunded reopens.
    policy(true);
    BOOST_TEST(refund(800) == 0);
    BOOST_TEST(committed() == 2000);
    BOOST_TEST(refund(1200) == 400);
    BOOST_TEST(committed() == 1600);
    BOOST_TEST(refund(500) == 400);  // an older event, replayed
    BOOST_TEST(committed() == 1600);
    // The reopened room is spent: the key is at its cap.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(1400), "in-reopened")).status == 200);
    f.settle_now();
    BOOST_TEST(committed() == 3000);
    // true → false: the 400 reopened stays reopened (else the 1400 would now be 400 over the cap); a later
    // refund reopens nothing.
    policy(false);
    BOOST_TEST(refund(1500) == 400);
    BOOST_TEST(committed() == 3000);
    BOOST_TEST(refund(1200) == 400);  // replayed
    BOOST_TEST(committed() == 3000);
    BOOST_TEST(exact());
    // true again: a later rise reopens, never more than the amount.
    policy(true);
    BOOST_TEST(refund(5000) == 900);
    BOOST_TEST(committed() == 2500);
    BOOST_TEST(exact());
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(500), "room-again")).status == 200);
    f.settle_now();
    BOOST_TEST(committed() == 3000);
    BOOST_TEST(exact());
}

// The proxy's in-flight hook end to end: bank debits (fake-stripe's US bank account test method) confirmed
// through the proxy are answered `processing`; the proxy settles each reservation and marks it in flight
// by itself. While the bank has not answered the reservation stays held (the cap refuses what would not
// fit); the resolver retrieves it by id: still processing → held; succeeded → settled for good; failed →
// released, its room back once. committed_cents equals the trigger's sum at every step.
BOOST_AUTO_TEST_CASE(a_bank_debit_through_the_proxy_is_held_while_processing_then_settled_or_released) {
    vault_fixture f;
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->settle_after(std::chrono::hours(1));  // the test settles the debits by hand
        co_return;
    }(f.fake.get()));
    auto k = f.issue(5000);
    auto debit = [&](const std::string& idem, std::int64_t amount) {
        auto r =
            f.send(f.post(k.secret, "/v1/payment_intents",
                          f.charge_body(amount) +
                              "&payment_method=pm_usBankAccount_processing&confirm=true&automatic_payment_"
                              "methods[enabled]=true&automatic_payment_methods[allow_redirects]=never",
                          idem));
        BOOST_TEST_REQUIRE(r.status == 200, idem << ": " << r.body);
        BOOST_TEST(r.body.find("\"processing\"") != std::string::npos, r.body);
    };
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    auto exact = [&] {
        return f.count(
                   "SELECT count(*) FROM vault_keys k WHERE id = '" + k.id +
                   "' AND committed_cents = (SELECT coalesce(sum(amount_cents - reopened_cents), 0) "
                   "FROM vault_spend s WHERE s.vault_key_id = k.id AND s.state IN ('reserved', 'settled', "
                   "'uncertain'))") == 1;
    };
    auto in_flight = [&](const std::string& idem) {
        return f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = '" + idem +
                       "' AND state = 'settled' AND settled_status = 'processing'") == 1;
    };
    debit("ach-ok", 2000);
    debit("ach-fail", 1500);
    f.settle_now();
    // The proxy marks the reservation in flight in a task of its own after answering; it has no completion
    // to await, so wait (bounded) for its write.
    for (int i = 0; i < 200 && !(in_flight("ach-ok") && in_flight("ach-fail")); ++i) f.pause(10ms);
    BOOST_TEST_REQUIRE(in_flight("ach-ok"));
    BOOST_TEST_REQUIRE(in_flight("ach-fail"));
    BOOST_TEST(committed() == 3500);
    BOOST_TEST(exact());
    // Held: 3500 + 2000 does not fit under 5000.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000), "no-room")).status == 402);
    // Due, still processing at the bank: checked, still held.
    f.scalar("UPDATE vault_spend SET reserved_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 2u);
    BOOST_TEST(in_flight("ach-ok"));
    BOOST_TEST(in_flight("ach-fail"));
    BOOST_TEST(committed() == 3500);
    BOOST_TEST(exact());
    // The bank answers: one debit succeeds, the other fails.
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 2u);
    auto settle = [&](const std::string& id, const std::string& outcome, const std::string& code) {
        return f.run([](fake::fake_stripe* fk, std::string id, std::string outcome,
                        std::string code) -> net::awaitable<bool> {
            co_return fk->settle(id, outcome, code);
        }(f.fake.get(), id, outcome, code));
    };
    BOOST_TEST_REQUIRE(settle(intents[0].id, "succeeded", ""));
    BOOST_TEST_REQUIRE(settle(intents[1].id, "failed", "insufficient_funds"));
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 2u);
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'ach-ok' AND state = 'settled' "
                "AND settled_status IS NULL AND stripe_object_id = '" +
                intents[0].id + "'") == 1);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'ach-fail' AND state = "
                       "'released' AND last_error LIKE '%insufficient_funds%'") == 1);
    BOOST_TEST(committed() == 2000);
    BOOST_TEST(exact());
    // Nothing is due twice; even made due, neither row is looked at again (both ended).
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 0u);
    BOOST_TEST(committed() == 2000);
    // The failed debit's room is usable again, to the cent: 2000 + 3000 = the cap.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(3000), "after-fail")).status == 200);
    f.settle_now();
    BOOST_TEST(committed() == 5000);
    BOOST_TEST(exact());
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(1), "over")).status == 402);
}

// An on-session PaymentIntent answered requires_action (3-D Secure) moved nothing but may still: its
// reservation keeps counting, and the proxy follows it by itself (no one marks it by hand). While the
// customer has not authenticated the room stays held; once the intent is canceled (the customer never
// authenticated; retry-declined cancels it before reopening the row) the resolver gives the room back,
// once, and a new create fits again.
BOOST_AUTO_TEST_CASE(an_intent_waiting_for_authentication_is_followed_and_released_when_canceled) {
    vault_fixture f;
    auto k = f.issue(2000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_3ds", {"authentication_required", "authentication_required"});
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/payment_intents",
                           f.charge_body(1500, "cus_3ds") +
                               "&payment_method=pm_card_visa&confirm=true&automatic_payment_methods["
                               "enabled]=true&automatic_payment_methods[allow_redirects]=never",
                           "needs-3ds"));
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    BOOST_TEST(r.body.find("\"requires_action\"") != std::string::npos, r.body);
    f.settle_now();
    auto followed = [&] {
        return f.count(
                   "SELECT count(*) FROM vault_spend WHERE idempotency_key = 'needs-3ds' AND state = "
                   "'settled' AND settled_status = 'requires_action'") == 1;
    };
    // The mark is a task of the proxy's own after its answer, with no completion to await: bounded wait.
    for (int i = 0; i < 200 && !followed(); ++i) f.pause(10ms);
    BOOST_TEST_REQUIRE(followed());
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    BOOST_TEST(committed() == 1500);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(1000), "no-room")).status == 402);
    // Due, still waiting for the customer: checked, still held.
    f.scalar("UPDATE vault_spend SET reserved_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(followed());
    BOOST_TEST(committed() == 1500);
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 1u);
    auto direct = f.direct_stripe();
    auto cancel = f.run(direct->call("POST", "/v1/payment_intents/" + intents[0].id + "/cancel",
                                     "cancellation_reason=abandoned", "cancel-3ds"));
    BOOST_TEST_REQUIRE(cancel.http.ok());
    BOOST_TEST_REQUIRE(cancel.http.resp.status == 200);
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(row_of(f, "needs-3ds") == "released:" + intents[0].id);
    BOOST_TEST(committed() == 0);
    f.scalar("UPDATE vault_spend SET in_flight_checked_at = now() - interval '1 hour' RETURNING 1");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 0u);  // ended: never released twice
    BOOST_TEST(committed() == 0);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000), "after-cancel")).status == 200);
    f.settle_now();
    BOOST_TEST(committed() == 2000);
}

// The holder of a key cancels, through the vault, an intent it created (what retry-declined does before
// charging a declined customer again): the cancel moves no money, so payment_intents.create allows it, and
// the reservation is released before the answer comes back, so the next create finds the room at once. A
// cancel of an intent the vault did not create under this key (another key's, an untagged one) is refused
// and never reaches Stripe; a declined intent (402, its row released already) is canceled all the same.
BOOST_AUTO_TEST_CASE(a_cancel_through_the_vault_releases_the_intents_reservation_at_once) {
    vault_fixture f;
    auto k = f.issue(2000);
    auto other = f.issue(2000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_3ds", {"authentication_required", "authentication_required"});
        fk->decline("cus_broke", {"card_declined", "insufficient_funds"});
        co_return;
    }(f.fake.get()));
    const std::string confirm =
        "&payment_method=pm_card_visa&confirm=true&automatic_payment_methods[enabled]="
        "true&automatic_payment_methods[allow_redirects]=never";
    auto r = f.send(f.post(k.secret, "/v1/payment_intents", f.charge_body(1500, "cus_3ds") + confirm, "3ds"));
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    r = f.send(f.post(k.secret, "/v1/payment_intents",
                      f.charge_body(400, "cus_broke") + confirm + "&off_session=true", "broke"));
    BOOST_TEST_REQUIRE(r.status == 402, r.body);
    f.settle_now();
    auto direct = f.direct_stripe();
    auto untagged = f.run(direct->call("POST", "/v1/payment_intents", f.charge_body(100), "untagged"));
    BOOST_TEST_REQUIRE(untagged.http.ok());
    auto intents = f.fake_intents();
    BOOST_TEST_REQUIRE(intents.size() == 3u);
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    BOOST_TEST(committed() == 1500);
    int sent = 0;
    auto cancel = [&](const std::string& secret, const std::string& id) {
        return f.send(f.post(secret, "/v1/payment_intents/" + id + "/cancel", "cancellation_reason=abandoned",
                             "cancel-" + std::to_string(++sent)));
    };
    auto status_of = [&](std::size_t i) {
        return f.run([](fake::fake_stripe* fk, std::size_t i) -> net::awaitable<std::string> {
            co_return fk->intents().at(i).status;
        }(f.fake.get(), i));
    };
    // Not this key's to cancel: refused before Stripe.
    BOOST_TEST(cancel(other.secret, intents[0].id).status == 403);
    BOOST_TEST(cancel(k.secret, intents[2].id).status == 403);
    BOOST_TEST(status_of(0) == "requires_action");
    BOOST_TEST(status_of(2) == "requires_confirmation");
    BOOST_TEST(committed() == 1500);
    // Its own: canceled at Stripe, the room back before the answer.
    r = cancel(k.secret, intents[0].id);
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status_of(0) == "canceled");
    BOOST_TEST(row_of(f, "3ds") == "released:" + intents[0].id);
    BOOST_TEST(committed() == 0);
    r = cancel(k.secret, intents[1].id);  // declined: released already, the intent canceled all the same
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status_of(1) == "canceled");
    BOOST_TEST(committed() == 0);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(2000), "room-back")).status == 200);
    f.settle_now();
    BOOST_TEST(committed() == 2000);
    // Canceled again: Stripe refuses (400), nothing is released twice.
    BOOST_TEST(cancel(k.secret, intents[0].id).status == 400);
    BOOST_TEST(committed() == 2000);
}

BOOST_AUTO_TEST_SUITE_END()
