// The sweeper (billing/heal/sweeper.hpp) and Stripe's webhook facts about a pending row, against real
// PostgreSQL and fake-stripe: a deferred fact hands the row to the sweeper at once, and a foreign charge
// carrying the row's key never settles it. g++ 12 -O2 false positive on Asio coroutine frames (GCC bug
// 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/heal/pending_age.hpp"
#include "billing/heal/sweeper.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/store/settlement_store.hpp"
#include "fixture.hpp"
#include "stripe/webhook_event.hpp"
#include "support/prom_text.hpp"
#include "sweeper_support.hpp"

using namespace std::chrono_literals;
using namespace cg;
using billing::verdict_reason;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::first_sample;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;
using cg::test::watch_pending_age;

namespace {

using namespace cg::test::sweeper_support;

// A charge event as Stripe sends it (Charges API: no PaymentIntent), carrying `billing_key` in its metadata,
// recorded through the store as the webhook receiver records it. Returns the outcome recorded.
std::string deliver_charge_event(fixture& f, billing::settlement_store& store, const std::string& event_id,
                                 const std::string& type, const std::string& charge_id,
                                 const std::string& customer, const std::string& billing_key,
                                 const std::string& status) {
    const std::string body = R"({"id":")" + event_id + R"(","object":"event","type":")" + type +
                             R"(","created":1800000000,"livemode":false,"data":{"object":{"id":")" +
                             charge_id +
                             R"(","object":"charge","amount":1999,"currency":"usd","customer":")" + customer +
                             R"(","status":")" + status + R"(","payment_intent":null,"amount_refunded":0,)" +
                             R"("metadata":{"billing_key":")" + billing_key + R"("}}}})";
    auto env = stripe::parse_webhook_event(body);
    BOOST_TEST_REQUIRE(env.has_value(), (env ? "" : env.err().message));
    auto r = f.run(store.record_event(*env, body));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST(!r->duplicate);
    return r->outcome;
}

std::string event_outcome(fixture& f, const std::string& event_id) {
    auto r = f.run(f.query("SELECT coalesce(outcome, '') FROM stripe_webhook_events WHERE id = $1",
                           pg::params(event_id)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST_REQUIRE(r->size() == 1u);
    return r->get<std::string>(0, 0);
}

billing::sweeper_config sweep_bound_hour() {
    auto c = sweep_now();
    c.after = 1h;  // a row active a moment ago is not abandoned by the bound
    return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_sweeper)

// The sidecar crashed between Stripe's answer and recording it: the row is pending with no Stripe id, and
// Stripe's webhook finds it by metadata only. The receiver never settles a pending row (deferred): the
// sweeper takes it up at its next sweep, without waiting for the bound, and the pipeline's recovery settles
// it with the payment the crashed worker made (replayed under the row's key: no second charge); the
// deferred fact then applies by the row's ids. Without the deferred fact the bound keeps the row waiting.
BOOST_AUTO_TEST_CASE(a_deferred_webhook_fact_hands_the_pending_row_to_recovery_at_once) {
    fixture f;
    auto p = f.make_pipeline();
    billing::settlement_store store(f.pg);
    auto body = event_json("sw-10", "2026-11", 1999);
    auto key = key_of("sw-10", "2026-11");
    f.dead_workers_row(body, "5a10", 30s);
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    auto made = run_async(
        f.io, [&]() { return f.stripe->create_charge(billing::build_charge_request(*ev, key, 1)); });
    BOOST_TEST_REQUIRE(made.charge_id != "");
    expire_lease(f, key);

    billing::sweeper s(sweep_bound_hour(), *p, f.pg, logger());
    auto before = sweep(f, s);
    BOOST_TEST_REQUIRE(before.has_value(), (before ? "" : before.err().describe()));
    BOOST_TEST(before->found == 0u);  // active a moment ago, and no word from Stripe yet

    auto outcome = deliver_charge_event(f, store, "evt_sw10", "charge.succeeded", made.charge_id, "cus_ok",
                                        key, "succeeded");
    BOOST_TEST(outcome == "deferred");
    auto pending = f.row(key);
    BOOST_TEST_REQUIRE(pending.has_value());
    BOOST_TEST(billing::to_string(pending->status) == "pending");  // the receiver settled nothing
    BOOST_TEST(!pending->charge_id.has_value());

    auto rep = sweep(f, s);
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->found == 1u);
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == made.charge_id);
    BOOST_TEST(f.fake->charges().size() == 1u);  // replayed, not made again

    auto applied = f.run(store.apply_recorded(key));
    BOOST_TEST_REQUIRE(applied.has_value(), (applied ? "" : applied.err().describe()));
    BOOST_TEST(event_outcome(f, "evt_sw10") == "no_change");  // the row's own payment, proved by its id
    auto again = sweep(f, s);
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->found == 0u);
}

// A charge made by hand for another customer carrying the row's billing_key reaches a pending row by
// metadata: it is deferred, never settles the row, and a live lease still keeps the sweeper out. Once the
// lease has expired the recovery searches the row's own customer in its own account, finds nothing of the
// row's there and charges the row once under its key; the foreign fact then comes out other_payment.
BOOST_AUTO_TEST_CASE(a_foreign_charge_carrying_the_key_never_settles_a_pending_row) {
    fixture f;
    auto p = f.make_pipeline();
    billing::settlement_store store(f.pg);
    auto key = key_of("sw-11", "2026-11");
    f.dead_workers_row(event_json("sw-11", "2026-11", 1999), "5a11", 30s);
    stripe::charge_request by_hand;
    by_hand.amount = 1999;
    by_hand.currency = "usd";
    by_hand.customer = "cus_foreign";
    by_hand.description = "same invoice, by hand";
    by_hand.metadata = {{"billing_key", key}};
    by_hand.idempotency_key = "by-hand-sw-11";
    auto foreign = run_async(f.io, [&]() { return f.stripe->create_charge(by_hand); });
    BOOST_TEST_REQUIRE(foreign.charge_id != "");

    auto outcome = deliver_charge_event(f, store, "evt_sw11", "charge.succeeded", foreign.charge_id,
                                        "cus_foreign", key, "succeeded");
    BOOST_TEST(outcome == "deferred");
    billing::sweeper s(sweep_bound_hour(), *p, f.pg, logger());
    auto leased = sweep(f, s);
    BOOST_TEST_REQUIRE(leased.has_value(), (leased ? "" : leased.err().describe()));
    BOOST_TEST(leased->found == 0u);  // a worker holds the lease: it is the pipeline's
    auto still = f.row(key);
    BOOST_TEST_REQUIRE(still.has_value());
    BOOST_TEST(billing::to_string(still->status) == "pending");
    BOOST_TEST(!still->charge_id.has_value());

    expire_lease(f, key);
    auto rep = sweep(f, s);
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->found == 1u);
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 2u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") != foreign.charge_id);
    BOOST_TEST(f.fake->posts_for(key) == 1);  // the row's own charge, under its key

    auto applied = f.run(store.apply_recorded(key));
    BOOST_TEST_REQUIRE(applied.has_value(), (applied ? "" : applied.err().describe()));
    BOOST_TEST(event_outcome(f, "evt_sw11") == "other_payment");
    auto after = f.row(key);
    BOOST_TEST_REQUIRE(after.has_value());
    BOOST_TEST(after->charge_id.value_or("") == rec->charge_id.value_or(""));
}

BOOST_AUTO_TEST_SUITE_END()
