// Recovery of corrections against real PostgreSQL and fake-stripe: a revision whose worker died between the
// ledger and Stripe, or whose refund was answered 500, is resolved by its key within Stripe's 24 hours and by
// a search of metadata after; its lease is renewed through a slow refund and a takeover is counted; the
// pending-age monitor and the sweeper take up an abandoned revision.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>

#include "billing/heal/pending_age.hpp"
#include "billing/heal/sweeper.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/store/correction_ledger.hpp"
#include "correction_support.hpp"
#include "fixture.hpp"
#include "stripe/refunds.hpp"
#include "stripe/types.hpp"
#include "support/prom_text.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::first_sample;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;
using cg::test::watch_pending_age;

namespace {

using fixture = test::billing_fixture;

using namespace cg::test::correction_support;

// A worker that started revision `rev` (moves planned, lease taken, the first move's attempt recorded), made
// its Stripe call for the first move when `call_stripe`, and died before recording the answer: its lease is
// then expired so a redelivery recovers the revision.
void dead_worker(fixture& f, const std::string& customer, std::int64_t total, int rev, bool call_stripe) {
    billing::correction_ledger store(f.pg);
    auto base = key_of(customer, "2026-11");
    auto key = billing::correction_key(base, rev);
    auto a = f.run(store.admit(key, base, rev, total, "usd", correction_json(customer, "2026-11", total, rev),
                               "dead", 60s));
    BOOST_TEST_REQUIRE(a.has_value(), (a ? "" : a.err().describe()));
    BOOST_TEST_REQUIRE(a->action == "run", a->action + " " + a->detail);
    auto ms = f.run(store.moves(key));
    BOOST_TEST_REQUIRE(ms.has_value());
    const auto& m = ms->front();
    auto att = f.run(store.record_attempt(key, m.part, a->epoch, 60s));
    BOOST_TEST_REQUIRE((att.has_value() && att->has_value()));
    if (call_stripe) {
        BOOST_TEST_REQUIRE(m.is_refund());
        stripe::refund_request req{*m.refund_of,
                                   m.amount_cents,
                                   {{"billing_key", key},
                                    {"corrects", base},
                                    {"revision", std::to_string(rev)},
                                    {"customer_id", customer},
                                    {"billing_period", "2026-11"}},
                                   key,
                                   {}};
        auto out = f.run(stripe::create_refund(*f.stripe, std::move(req)));
        BOOST_TEST_REQUIRE((out.cls == stripe::outcome_class::succeeded), out.message);
    }
    auto r =
        f.run(f.query("UPDATE billing_corrections SET lease_until = now() - interval '1 s' WHERE key = $1",
                      pg::params(key)));
    BOOST_TEST_REQUIRE(r.has_value());
}

// A redelivery of `d` through `p` once the fake has received more than `seen` requests (the first
// pipeline's Stripe call has arrived) and `after` more has passed; its verdict into *out, then `done`
// cancelled. The fake answers on this io_context and tells nobody of an arrival: its request count is read
// every 5 ms.
net::awaitable<void> redeliver_during_call(fixture* f, billing::charge_flow* p, billing::delivery d,
                                           std::size_t seen, std::chrono::milliseconds after,
                                           std::optional<billing::verdict>* out, net::steady_timer* done) {
    net::steady_timer t(co_await asio::this_coro::executor);
    while (f->fake->requests() <= seen) {
        t.expires_after(5ms);
        co_await t.async_wait();
    }
    t.expires_after(after);
    co_await t.async_wait();
    *out = co_await p->handle(std::move(d));
    done->cancel();
}

billing::sweeper_config sweep_now() {
    billing::sweeper_config c;
    c.after = 0ms;  // any pending revision whose lease has expired counts as abandoned
    c.interval = 1h;
    return c;
}

void set_lease(fixture& f, const std::string& correction_key, const std::string& interval) {
    auto r = f.run(f.query("UPDATE billing_corrections SET lease_until = now() + $2::interval WHERE key = $1",
                           pg::params(correction_key, interval)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
}

std::string move_object(fixture& f, const std::string& correction_key) {
    auto r =
        f.run(f.query("SELECT coalesce(stripe_object_id, '') FROM billing_correction_moves "
                      "WHERE correction_key = $1 AND part = 1",
                      pg::params(correction_key)));
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST_REQUIRE(r->size() == 1u);
    return r->get<std::string>(0, 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_corrections)

// A worker recorded the refund's attempt, Stripe made the refund, the worker died before the ledger heard:
// the redelivery (inside Stripe's window) re-sends the same key and Stripe replays the refund: one refund.
BOOST_AUTO_TEST_CASE(crash_between_ledger_and_stripe_refunds_once) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-4", "2026-11");
    auto orig = charge_original(f, *p, "cor-4");
    dead_worker(f, "cor-4", 250, 1, true);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(status_of(f, base + "-r1") == "pending");

    auto v = f.handle(*p, delivery_of(correction_json("cor-4", "2026-11", 250, 1), "c401", 2));
    BOOST_TEST(reason(v) == "refunded", v.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 750);
    BOOST_TEST(v.detail == f.fake->refunds()[0].id);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 2);  // the dead worker's and the replayed one
    BOOST_TEST(status_of(f, base + "-r1") == "applied");
}

// The same crash found 25 h later, after Stripe forgot the key: the redelivery searches the charge's refunds
// for the key and records the refund it finds — no second refund, no new key.
BOOST_AUTO_TEST_CASE(crashed_refund_past_24h_is_found_by_search) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-5", "2026-11");
    auto orig = charge_original(f, *p, "cor-5");
    dead_worker(f, "cor-5", 600, 1, true);
    f.clock_offset = 25h;
    f.fake->advance_clock(25h);
    auto v = f.handle(*p, delivery_of(correction_json("cor-5", "2026-11", 600, 1), "c501", 3));
    BOOST_TEST(reason(v) == "refunded", v.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 400);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 1);     // only the dead worker's
    BOOST_TEST(f.fake->posts_for(base + "-r1-g2") == 0);  // never a new key beside a refund that exists
}

// The other side of the boundary: the attempt was recorded but the call never reached Stripe, and 25 h
// passed. The search finds nothing, so the refund is made under a new key generation — once.
BOOST_AUTO_TEST_CASE(unsent_refund_past_24h_is_made_under_a_new_key) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-6", "2026-11");
    auto orig = charge_original(f, *p, "cor-6");
    dead_worker(f, "cor-6", 100, 1, false);
    f.clock_offset = 25h;
    f.fake->advance_clock(25h);
    auto v = f.handle(*p, delivery_of(correction_json("cor-6", "2026-11", 100, 1), "c601", 2));
    BOOST_TEST(reason(v) == "refunded", v.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 900);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 0);
    BOOST_TEST(f.fake->posts_for(base + "-r1-g2") == 1);
    auto again = f.handle(*p, delivery_of(correction_json("cor-6", "2026-11", 100, 1), "c601", 3));
    BOOST_TEST(reason(again) == "duplicate_prevented");
    BOOST_TEST(f.fake->refunds().size() == 1u);
}

// Stripe answers a refund with a 500 after making it (saved and replayed for the key): the revision stays
// pending, and the redelivery's search finds the refund by its metadata — one refund.
BOOST_AUTO_TEST_CASE(refund_answered_500_is_resolved_by_search) {
    fixture f;
    auto p = f.make_pipeline();
    auto orig = charge_original(f, *p, "cor-7");
    f.fake->faults().fail_after_create = 1;
    f.fake->faults().fault_path = "/v1/refunds";
    auto v = f.handle(*p, delivery_of(correction_json("cor-7", "2026-11", 300, 1), "c701"));
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    auto v2 = f.handle(*p, delivery_of(correction_json("cor-7", "2026-11", 300, 1), "c701", 2));
    BOOST_TEST(reason(v2) == "refunded", v2.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 700);
}

// A refund Stripe refuses as sent (the charge was refunded outside the ledger, in the dashboard): the
// revision fails with a dead letter "stripe rejected" instead of retrying for ever or guessing.
BOOST_AUTO_TEST_CASE(refund_of_an_already_refunded_charge_is_dead_lettered) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-8", "2026-11");
    auto orig = charge_original(f, *p, "cor-8");
    stripe::refund_request outside{orig, 1000, {}, "dashboard-refund", {}};
    auto out = f.run(stripe::create_refund(*f.stripe, std::move(outside)));
    BOOST_TEST_REQUIRE((out.cls == stripe::outcome_class::succeeded), out.message);
    auto v = f.handle(*p, delivery_of(correction_json("cor-8", "2026-11", 500, 1), "c801"));
    BOOST_TEST(reason(v) == "dead_lettered", v.detail);
    BOOST_TEST(v.detail.find("charge_already_refunded") != std::string::npos, v.detail);
    BOOST_TEST(f.dead_letters("c801") == 1);
    BOOST_TEST(status_of(f, base + "-r1") == "failed");
    BOOST_TEST(f.fake->refunds().size() == 1u);
}

// Stripe slower than the lease on a refund: the revision's lease is renewed while the call is awaited (and
// the message touched), so a second pipeline handling a redelivery 2.8 s into the call — past the 2 s lease
// the attempt took — finds it held and sends nothing. Without the renewal it takes the expired lease and
// sends the same refund again (409 in use here; after Stripe's 24 h, a search and a new key beside a refund
// still in flight).
BOOST_AUTO_TEST_CASE(lease_is_renewed_during_a_slow_refund) {
    fixture f;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 2000ms;  // renewals 200 ms apart: holds through a 1.8 s stall of a loaded machine
    cfg.lease_renew_interval = 200ms;
    auto a = f.make_pipeline(cfg);
    auto b = f.make_pipeline(cfg);
    auto base = key_of("cor-10", "2026-11");
    auto orig = charge_original(f, *a, "cor-10");
    auto body = correction_json("cor-10", "2026-11", 400, 1);
    f.fake->faults().latency_ms = 5000;

    std::optional<billing::verdict> vb;
    net::steady_timer b_done(f.io, std::chrono::steady_clock::time_point::max());
    int touches = 0;
    billing::touch_fn touch = [&] { ++touches; };
    asio::co_spawn(f.io,
                   redeliver_during_call(&f, b.get(), delivery_of(body, "ca01", 2), f.fake->requests(),
                                         2800ms, &vb, &b_done),
                   asio::detached);
    auto va = run_async(f.io, [&]() -> net::awaitable<billing::verdict> {
        auto v = co_await a->handle(delivery_of(body, "ca01", 1), touch);
        if (!vb) co_await b_done.async_wait();  // cancelled when b finishes
        co_return v;
    });
    BOOST_TEST_REQUIRE(vb.has_value());
    BOOST_TEST(reason(*vb) == "requeued_lease_held", vb->detail);
    BOOST_TEST(reason(va) == "refunded", va.detail);
    BOOST_TEST(touches >= 7);  // every 200 ms of a 5 s call
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 1);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 600);
    BOOST_TEST(status_of(f, base + "-r1") == "applied");
}

// The revision's lease taken over while a refund is awaited is counted with the charges' lost leases, and the
// refund is still made once.
BOOST_AUTO_TEST_CASE(a_revisions_lease_taken_over_during_a_refund_is_counted) {
    fixture f;
    metrics::registry reg;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 5000ms;
    cfg.lease_renew_interval = 200ms;
    auto p = f.make_pipeline(cfg, &reg);
    auto base = key_of("cor-lost", "2026-11");
    auto orig = charge_original(f, *p, "cor-lost");
    auto body = correction_json("cor-lost", "2026-11", 400, 1);
    f.fake->faults().latency_ms = 3000;

    bool taken = false;
    auto touch = f.take_lease_at_second_touch("billing_corrections", base + "-r1", &taken);
    auto v = run_async(f.io, [&]() { return p->handle(delivery_of(body, "cl01", 1), touch); });
    BOOST_TEST_REQUIRE(taken);
    BOOST_TEST(first_sample(reg, "chargeguard_billing_lease_lost_total") == 1.0, reason(v));
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(refunded_on(f, orig) == 600);
}

// The pending-age gauges count correction revisions beside ledger rows: a revision left pending by a dead
// worker is pending, and abandoned once its lease expired — as the sweeper will find it.
BOOST_AUTO_TEST_CASE(pending_age_counts_a_pending_revision_and_its_abandonment) {
    fixture f;
    auto p = f.make_pipeline();
    charge_original(f, *p, "cor-age");
    dead_worker(f, "cor-age", 250, 1, false);
    set_lease(f, key_of("cor-age", "2026-11") + "-r1", "-1 second");
    f.dead_workers_row(event_json("cor-age-2", "2026-11", 100), "ag02", 30s);  // a leased ledger row
    metrics::registry reg;
    billing::pending_age_monitor m(f.pg, reg, logger(), 20ms);
    m.watch_abandoned(0ms);
    auto value = [&](const std::string& family) { return first_sample(reg, family); };
    // The revision comes from the same statement as the ledger row: once the row is counted, a few more
    // periods are ample.
    watch_pending_age(
        f, m, [&] { return value("chargeguard_billing_pending_records") >= 2.0; },
        [&] { return value("chargeguard_billing_pending_records") >= 1.0; }, 50);
    BOOST_TEST(value("chargeguard_billing_pending_records") == 2.0);
    BOOST_TEST(value("chargeguard_billing_abandoned_records") == 1.0);
    BOOST_TEST(value("chargeguard_billing_oldest_abandoned_age_seconds") >= 0.0);
}

// The revision's message is gone (FINed before a failover lost the revision's last write, or dropped) after a
// worker made its refund at Stripe and died before the ledger heard. The sweeper leaves it while its lease
// is live; once the lease expired it resolves it without any redelivery: inside Stripe's 24 h it re-sends the
// same key, Stripe replays the refund, and the revision is applied with it — one refund.
BOOST_AUTO_TEST_CASE(sweeper_resolves_an_abandoned_refund_under_its_key_within_24h) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-s1", "2026-11");
    auto orig = charge_original(f, *p, "cor-s1");
    dead_worker(f, "cor-s1", 250, 1, true);
    BOOST_TEST_REQUIRE(f.fake->refunds().size() == 1u);
    billing::sweeper s(sweep_now(), *p, f.pg, logger());

    set_lease(f, base + "-r1", "1 minute");  // a live worker's lease: not the sweeper's to take
    auto live = f.run(s.sweep_once());
    BOOST_TEST_REQUIRE(live.has_value(), (live ? "" : live.err().describe()));
    BOOST_TEST(live->corrections_found == 0u);
    BOOST_TEST(status_of(f, base + "-r1") == "pending");

    set_lease(f, base + "-r1", "-1 second");
    auto rep = f.run(s.sweep_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->corrections_found == 1u);
    BOOST_TEST(rep->count(billing::verdict_reason::refunded) == 1u);
    BOOST_TEST(status_of(f, base + "-r1") == "applied");
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 2);  // the dead worker's and the sweeper's, replayed
    BOOST_TEST(move_object(f, base + "-r1") == f.fake->refunds()[0].id);
    BOOST_TEST(refunded_on(f, orig) == 750);
    auto again = f.run(s.sweep_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->corrections_found == 0u);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 2);
}

// The same abandoned refund found 25 h later, after Stripe forgot the key: the sweeper searches the charge's
// refunds by metadata[billing_key] and records the refund it finds — no second refund, no new key — again
// with no redelivery.
BOOST_AUTO_TEST_CASE(sweeper_finds_an_abandoned_refund_by_metadata_past_24h) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-s2", "2026-11");
    auto orig = charge_original(f, *p, "cor-s2");
    dead_worker(f, "cor-s2", 600, 1, true);
    f.clock_offset = 25h;
    f.fake->advance_clock(25h);
    billing::sweeper s(sweep_now(), *p, f.pg, logger());
    auto rep = f.run(s.sweep_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->corrections_found == 1u);
    BOOST_TEST(rep->count(billing::verdict_reason::refunded) == 1u);
    BOOST_TEST(status_of(f, base + "-r1") == "applied");
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(move_object(f, base + "-r1") == f.fake->refunds()[0].id);
    BOOST_TEST(refunded_on(f, orig) == 400);
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 1);     // only the dead worker's
    BOOST_TEST(f.fake->posts_for(base + "-r1-g2") == 0);  // never a new key beside a refund that exists
}

BOOST_AUTO_TEST_SUITE_END()
