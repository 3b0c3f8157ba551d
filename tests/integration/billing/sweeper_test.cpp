// The sweeper (billing/heal/sweeper.hpp) against real PostgreSQL and fake-stripe: pending rows whose message
// is gone are resolved through the pipeline's own machine, under the ledger's lease rules. g++ 12 -O2 false
// positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include "billing/heal/sweeper.hpp"

#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <thread>

#include "billing/heal/pending_age.hpp"
#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
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

// Runs `a` into *out; the last of `*left` concurrent runs cancels `done` (used as an event).
template <typename T>
net::awaitable<void> run_into(net::awaitable<T> a, std::optional<T>* out, int* left,
                              net::steady_timer* done) {
    out->emplace(co_await std::move(a));
    if (--*left == 0) done->cancel();
}

double swept(metrics::registry& reg, const std::string& outcome) {
    auto fams = test::parse_prometheus(reg.render());
    auto it = fams.find("chargeguard_billing_swept_total");
    if (it == fams.end()) return -1;
    for (auto& s : it->second.samples)
        if (s.labels.count("outcome") && s.labels.at("outcome") == outcome) return s.value;
    return -1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_sweeper)

// The failover loss: the charge succeeded at Stripe, the settle was lost, the message FINed. The sweeper
// replays the same key, Stripe answers with the charge it made, and the row is settled with that id — no
// second charge. Without the sweeper the row stays pending.
BOOST_AUTO_TEST_CASE(abandoned_row_charged_at_stripe_is_settled_with_its_charge) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline();
    auto body = event_json("sw-1", "2026-11", 1999);
    auto key = key_of("sw-1", "2026-11");
    f.dead_workers_row(body, "5a01", 30s);
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    auto made = run_async(
        f.io, [&]() { return f.stripe->create_charge(billing::build_charge_request(*ev, key, 1)); });
    BOOST_TEST_REQUIRE(made.charge_id != "");
    expire_lease(f, key);

    billing::sweeper s(sweep_now(), *p, f.pg, logger(), &reg);
    auto rep = sweep(f, s);
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->found == 1u);
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == made.charge_id);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(swept(reg, "charged") == 1.0);
    BOOST_TEST(swept(reg, "requeued_lease_held") == 0.0);
    // Healed: the next sweep finds nothing.
    auto again = sweep(f, s);
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->found == 0u);
}

// The row's insert committed, Stripe never heard of it, and no message is left to come back: the sweeper
// charges it once, from the fields the row holds (description included), and a second sweep does nothing.
BOOST_AUTO_TEST_CASE(abandoned_row_without_stripe_object_is_charged_once) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("sw-2", "2026-11");
    f.dead_workers_row(event_json("sw-2", "2026-11", 2500), "5a02", 30s);
    expire_lease(f, key);
    BOOST_TEST(f.fake->charges().empty());

    billing::sweeper s(sweep_now(), *p, f.pg, logger());
    auto rep = sweep(f, s);
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);
    const auto& ch = f.fake->charges()[0];
    BOOST_TEST(ch.amount == 2500);
    BOOST_TEST(ch.customer == "cus_ok");
    BOOST_TEST(ch.description == "plan 2026-11");
    BOOST_TEST(f.fake->posts_for(key) == 1);  // under the row's own key, generation 1
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == ch.id);
    auto again = sweep(f, s);
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->found == 0u);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// A PaymentIntent event's row holds its payment method and off_session: the sweeper confirms an intent with
// them, as the original delivery would have.
BOOST_AUTO_TEST_CASE(abandoned_payment_intent_row_is_charged_with_its_payment_method) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("sw-3", "2026-11");
    std::string body =
        R"({"customer_id":"sw-3","billing_period":"2026-11","amount_cents":700,"currency":"usd",)"
        R"("stripe_customer_id":"cus_ok","payment_method":"pm_card_visa","off_session":true})";
    f.dead_workers_row(body, "5a03", 30s);
    expire_lease(f, key);
    billing::sweeper s(sweep_now(), *p, f.pg, logger());
    auto rep = sweep(f, s);
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    BOOST_TEST(f.fake->intents()[0].payment_method == "pm_card_visa");
    BOOST_TEST(f.fake->charges().size() == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
}

// The sweeper and a late redelivery of the same event run at once: one of them takes the lease (the same
// take-lease statement), the other sees it held (or the row settled). Exactly one POST, one charge, the row
// charged. A sweeper that charged without the lease would POST a second time under the key.
BOOST_AUTO_TEST_CASE(race_with_a_live_delivery_charges_once) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("sw-4", "2026-11", 900);
    auto key = key_of("sw-4", "2026-11");
    f.dead_workers_row(body, "5a04", 30s);
    expire_lease(f, key);
    f.fake->faults().latency_ms = 500;  // whoever reaches Stripe first is there while the other decides

    billing::sweeper s(sweep_now(), *p, f.pg, logger());
    std::optional<report> rep;
    std::optional<billing::verdict> v;
    int left = 2;
    net::steady_timer done(f.io, std::chrono::steady_clock::time_point::max());
    run_async(f.io, [&]() -> net::awaitable<void> {
        asio::co_spawn(f.io, run_into(s.sweep_once(), &rep, &left, &done), asio::detached);
        asio::co_spawn(f.io, run_into(p->handle(delivery_of(body, "5a04", 2)), &v, &left, &done),
                       asio::detached);
        co_await done.async_wait();
    });
    BOOST_TEST_REQUIRE(rep.has_value());
    BOOST_TEST_REQUIRE(rep->has_value());
    BOOST_TEST_REQUIRE(v.has_value());
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    auto swept_charged = (*rep)->count(verdict_reason::charged);
    BOOST_TEST(swept_charged + (reason(*v) == "charged" ? 1u : 0u) == 1u, reason(*v) << " " << v->detail);
    if (swept_charged == 1)
        BOOST_TEST((reason(*v) == "requeued_lease_held" || reason(*v) == "duplicate_prevented"), reason(*v));
}

// Two sidecars' sweepers find the same row: one works it, the other finds the lease taken (or the row gone
// from its query). One POST.
BOOST_AUTO_TEST_CASE(two_sweepers_on_one_row_one_works_it) {
    fixture f;
    auto pa = f.make_pipeline();
    auto pb = f.make_pipeline();
    auto key = key_of("sw-5", "2026-11");
    f.dead_workers_row(event_json("sw-5", "2026-11", 1200), "5a05", 30s);
    expire_lease(f, key);
    f.fake->faults().latency_ms = 500;

    billing::sweeper a(sweep_now(), *pa, f.pg, logger());
    billing::sweeper b(sweep_now(), *pb, f.pg, logger());
    std::optional<report> ra, rb;
    int left = 2;
    net::steady_timer done(f.io, std::chrono::steady_clock::time_point::max());
    run_async(f.io, [&]() -> net::awaitable<void> {
        asio::co_spawn(f.io, run_into(a.sweep_once(), &ra, &left, &done), asio::detached);
        asio::co_spawn(f.io, run_into(b.sweep_once(), &rb, &left, &done), asio::detached);
        co_await done.async_wait();
    });
    BOOST_TEST_REQUIRE((ra && *ra && rb && *rb));
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST((*ra)->count(verdict_reason::charged) + (*rb)->count(verdict_reason::charged) == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
}

// Left alone: a row whose lease is live (a worker is charging it), a row active more recently than the bound,
// a row of another key namespace, and a row written before migration 0011 (no namespace recorded). No
// Stripe request, no lease taken.
BOOST_AUTO_TEST_CASE(rows_not_abandoned_or_not_ours_are_left_alone) {
    fixture f;
    auto p = f.make_pipeline();
    auto live = f.dead_workers_row(event_json("sw-6", "2026-11", 100), "5a06", 30s);
    auto recent = f.dead_workers_row(event_json("sw-7", "2026-11", 100), "5a07", 30s);
    expire_lease(f, recent.key);
    auto ev = billing::parse_event(event_json("sw-8", "2026-11", 100));
    BOOST_TEST_REQUIRE(ev.has_value());
    billing::new_record other{billing::base_key("other", "sw-8", "2026-11"), *ev, "5a08", 1, "other"};
    auto pf = f.run(f.ledger->preflight(other, 30s));
    BOOST_TEST_REQUIRE((pf && pf->inserted));
    expire_lease(f, other.key);
    auto old = f.dead_workers_row(event_json("sw-9", "2026-11", 100), "5a09", 30s);
    auto cleared =
        f.run(f.query("UPDATE billing_records SET key_namespace = NULL, lease_until = now() - interval '1 s' "
                      "WHERE key = $1",
                      pg::params(old.key)));
    BOOST_TEST_REQUIRE(cleared.has_value());

    // Bound 0: only the live lease keeps sw-6 out; sw-8 and sw-9 are not this sidecar's to sweep.
    billing::sweeper now(sweep_now(), *p, f.pg, logger());
    // Bound 1 h: sw-7's lease expired, but it was active a moment ago.
    auto hour = sweep_now();
    hour.after = 1h;
    billing::sweeper later(hour, *p, f.pg, logger());
    auto r_hour = sweep(f, later);
    BOOST_TEST_REQUIRE(r_hour.has_value(), (r_hour ? "" : r_hour.err().describe()));
    BOOST_TEST(r_hour->found == 0u);
    auto r_now = sweep(f, now);
    BOOST_TEST_REQUIRE(r_now.has_value(), (r_now ? "" : r_now.err().describe()));
    BOOST_TEST(r_now->found == 1u);  // sw-7 only
    BOOST_TEST(r_now->count(verdict_reason::charged) == 1u);
    BOOST_TEST(f.fake->posts_for(recent.key) == 1);
    BOOST_TEST(f.fake->posts_for(live.key) == 0);
    BOOST_TEST(f.fake->posts_for(other.key) == 0);
    BOOST_TEST(f.fake->posts_for(old.key) == 0);
    auto live_now = f.row(live.key);
    BOOST_TEST_REQUIRE(live_now.has_value());
    BOOST_TEST(live_now->lease_epoch == live.lease_epoch);  // its lease was never taken
    BOOST_TEST(billing::to_string(live_now->status) == "pending");
}

// A failover sweep (sweep_once with the time since the failover, after its grace): a row still leased on the
// new primary that nothing wrote since the failover has no live holder — its lease is ended under the epoch
// read and the row charged now, not when the lease runs out — while a row whose holder renewed its lease
// after the failover (as a live delivery's lease keeper does while its call is awaited) is left to it: never
// selected, its lease and epoch as the holder left them, no Stripe request.
BOOST_AUTO_TEST_CASE(failover_sweep_ends_a_lease_nothing_wrote_since_and_leaves_a_renewed_one) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline();
    auto gone = f.dead_workers_row(event_json("sw-12", "2026-11", 100), "5a12", 30s);
    auto live = f.dead_workers_row(event_json("sw-13", "2026-11", 100), "5a13", 30s);
    // The failover, between the rows' last writes and the live holder's renewal, its timestamp apart from
    // both: the sweep's statement places it at its own now() less the time since, later than this clock's
    // moment by the time the statement takes to start, so the renewal comes well after it.
    std::this_thread::sleep_for(50ms);
    const auto failed_over = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(300ms);
    auto renewed = f.run(f.query(
        "UPDATE billing_records SET lease_until = now() + interval '30 s', lease_epoch = lease_epoch + 1, "
        "last_stripe_attempt_at = now() WHERE key = $1 AND lease_epoch = $2 RETURNING lease_epoch",
        pg::params(live.key, live.lease_epoch)));
    BOOST_TEST_REQUIRE((renewed && renewed->size() == 1u));
    const auto live_epoch = renewed->get<std::int64_t>(0, 0);

    billing::sweeper s(sweep_now(), *p, f.pg, logger(), &reg);
    const auto since =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - failed_over);
    auto rep = f.run(s.sweep_once(since));
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->found == 1u);  // sw-12 only
    BOOST_TEST(rep->count(verdict_reason::charged) == 1u);
    BOOST_TEST(first_sample(reg, "chargeguard_billing_failover_leases_ended_total") == 1.0);
    auto gone_now = f.row(gone.key);
    BOOST_TEST_REQUIRE(gone_now.has_value());
    BOOST_TEST(billing::to_string(gone_now->status) == "charged");
    BOOST_TEST(f.fake->posts_for(gone.key) == 1);
    auto live_now = f.row(live.key);
    BOOST_TEST_REQUIRE(live_now.has_value());
    BOOST_TEST(billing::to_string(live_now->status) == "pending");
    BOOST_TEST(live_now->lease_epoch == live_epoch);
    BOOST_TEST(live_now->lease_remaining.value_or(0ms) > 20s);
    BOOST_TEST(f.fake->posts_for(live.key) == 0);
}

// The pending-age monitor, given the sweep bound, counts what the sweeper would take up: of two pending rows
// the one whose lease expired, not the one a worker holds.
BOOST_AUTO_TEST_CASE(pending_age_reports_abandoned_rows_by_the_sweep_bound) {
    fixture f;
    f.dead_workers_row(event_json("sw-10", "2026-11", 100), "5a10", 30s);
    auto gone = f.dead_workers_row(event_json("sw-11", "2026-11", 100), "5a11", 30s);
    expire_lease(f, gone.key);
    metrics::registry reg;
    billing::pending_age_monitor m(f.pg, reg, logger(), 20ms);
    m.watch_abandoned(0ms);
    auto value = [&](const std::string& family) { return first_sample(reg, family); };
    auto both = [&] { return value("chargeguard_billing_pending_records") == 2.0; };
    watch_pending_age(f, m, both, both, 1000);  // until the monitor has reported both rows
    BOOST_TEST(value("chargeguard_billing_abandoned_records") == 1.0);
    BOOST_TEST(value("chargeguard_billing_oldest_abandoned_age_seconds") >= 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
