// Corrections (docs/design.md §4a) end to end: real PostgreSQL (migrations applied), fake-stripe over TLS,
// the real stripe::client and the pipeline. Each test names the failure it would catch. g++ 12 -O2 false
// positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>

#include "billing/heal/pending_age.hpp"
#include "billing/heal/settlement_poller.hpp"
#include "billing/heal/sweeper.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/store/correction_ledger.hpp"
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

// A correction: the period's new total as revision N.
std::string correction_json(const std::string& customer, const std::string& period, std::int64_t total,
                            int revision) {
    auto body = event_json(customer, period, total);
    body.pop_back();
    return body + ",\"revision\":" + std::to_string(revision) + "}";
}

// The same event paid with a payment method (a PaymentIntent, confirmed off-session); revision 0 is the
// original.
std::string intent_json(const std::string& customer, std::int64_t total, int revision,
                        const std::string& pm) {
    auto body = event_json(customer, "2026-11", total);
    body.pop_back();
    body += R"(,"payment_method":")" + pm + "\"";
    if (revision > 0) body += ",\"revision\":" + std::to_string(revision);
    return body + "}";
}

std::string meta(const std::vector<std::pair<std::string, std::string>>& m, const std::string& k) {
    stripe::metadata md(m.begin(), m.end());
    return std::string(stripe::metadata_value(md, k).value_or(""));
}

// The sum of the fake's refunds that stand (not failed or canceled) on one charge.
std::int64_t refunded_on(const fixture& f, const std::string& charge) {
    std::int64_t sum = 0;
    for (const auto& r : f.fake->refunds())
        if (r.charge == charge && !stripe::refund_undone(r.status)) sum += r.amount;
    return sum;
}

// Net money at Stripe for a customer: charges that succeeded less refunds that stand.
std::int64_t net_at_stripe(const fixture& f) {
    std::int64_t sum = 0;
    for (const auto& c : f.fake->charges())
        if (c.status == "succeeded") sum += c.amount - c.amount_refunded;
    return sum;
}

std::string status_of(fixture& f, const std::string& correction_key) {
    auto r =
        f.run(f.query("SELECT status FROM billing_corrections WHERE key = $1", pg::params(correction_key)));
    BOOST_TEST_REQUIRE(r.has_value());
    if (r->size() == 0) return "absent";
    return r->get<std::string>(0, 0);
}

// Charges the original (1000) and returns its charge id.
std::string charge_original(fixture& f, billing::charge_flow& p, const std::string& customer,
                            std::int64_t amount = 1000) {
    auto v = f.handle(p, delivery_of(event_json(customer, "2026-11", amount), customer + "-orig"));
    BOOST_TEST_REQUIRE(reason(v) == "charged", v.detail);
    return v.detail;
}

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

// Revision 1 raises the total: the difference is charged under base-r1 with metadata naming the original;
// revision 2 lowers it below the original: 800 refunded, the newest payment first (revision 1's 500 whole,
// then 300 of the original), under base-r2 and base-r2-p2. The ledger keeps each revision and its moves.
BOOST_AUTO_TEST_CASE(charge_then_refund_spanning_payments) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-1", "2026-11");
    auto orig = charge_original(f, *p, "cor-1");

    auto v1 = f.handle(*p, delivery_of(correction_json("cor-1", "2026-11", 1500, 1), "c101"));
    BOOST_TEST(reason(v1) == "charged", v1.detail);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 2u);
    const auto& ch1 = f.fake->charges()[1];
    BOOST_TEST(ch1.amount == 500);
    BOOST_TEST(meta(ch1.metadata, "billing_key") == base + "-r1");
    BOOST_TEST(meta(ch1.metadata, "corrects") == base);
    BOOST_TEST(meta(ch1.metadata, "revision") == "1");
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 1);
    BOOST_TEST(f.fake->posts_for(base) == 1);  // the original's key is untouched

    auto v2 = f.handle(*p, delivery_of(correction_json("cor-1", "2026-11", 700, 2), "c102"));
    BOOST_TEST(reason(v2) == "refunded", v2.detail);
    BOOST_TEST_REQUIRE(f.fake->refunds().size() == 2u);
    BOOST_TEST(refunded_on(f, ch1.id) == 500);
    BOOST_TEST(refunded_on(f, orig) == 300);
    BOOST_TEST(f.fake->posts_for(base + "-r2") == 1);
    BOOST_TEST(f.fake->posts_for(base + "-r2-p2") == 1);
    BOOST_TEST(meta(f.fake->refunds()[0].metadata, "billing_key") == base + "-r2");
    BOOST_TEST(net_at_stripe(f) == 700);

    BOOST_TEST(status_of(f, base + "-r1") == "applied");
    BOOST_TEST(status_of(f, base + "-r2") == "applied");
    BOOST_TEST(f.scalar("SELECT delta_cents FROM billing_corrections WHERE key = $1", base + "-r2") == -800);
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM billing_correction_moves WHERE correction_key = $1 AND status = "
                 "'done' AND stripe_object_id LIKE 're\\_%'",
                 base + "-r2") == 2);
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", base) == 700);
}

// Revision 2 before revision 1, and a revision before the original: each waits (requeued, never
// dead-lettered, no Stripe call) and applies once its predecessor has; the money ends at the last total.
BOOST_AUTO_TEST_CASE(revisions_out_of_order_wait_for_their_predecessor) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-2", "2026-11");
    auto early = f.handle(*p, delivery_of(correction_json("cor-2", "2026-11", 1200, 1), "c200"));
    BOOST_TEST(reason(early) == "requeued_waiting", early.detail);
    BOOST_TEST(!early.finished());
    BOOST_TEST(f.fake->requests() == 0u);

    charge_original(f, *p, "cor-2");
    auto w = f.handle(*p, delivery_of(correction_json("cor-2", "2026-11", 400, 2), "c202"));
    BOOST_TEST(reason(w) == "requeued_waiting", w.detail);
    BOOST_TEST(w.detail == "waiting for revision 1");
    BOOST_TEST(w.delay >= f.config_for_pipeline().correction_wait_delay);
    BOOST_TEST(f.fake->refunds().empty());
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.dead_letters("c202") == 0);

    BOOST_TEST(reason(f.handle(*p, delivery_of(correction_json("cor-2", "2026-11", 1200, 1), "c200", 2))) ==
               "charged");
    BOOST_TEST(reason(f.handle(*p, delivery_of(correction_json("cor-2", "2026-11", 400, 2), "c202", 2))) ==
               "refunded");
    BOOST_TEST(net_at_stripe(f) == 400);
    // Revision 2 refunded 800: revision 1's 200 and 600 of the original.
    BOOST_TEST(f.fake->refunds().size() == 2u);
    BOOST_TEST(f.scalar("SELECT delta_cents FROM billing_corrections WHERE key = $1", base + "-r2") == -800);
}

// Duplicates and stale revisions move nothing: the same revision redelivered (and re-published under another
// message id) is a prevented duplicate; an older revision with another total after a newer one started is
// superseded; the latest revision with another total is a conflict (dead-lettered); a total equal to the
// money moved is applied with nothing to move.
BOOST_AUTO_TEST_CASE(duplicate_stale_and_conflicting_revisions_are_no_ops) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-3", "2026-11");
    charge_original(f, *p, "cor-3");
    BOOST_TEST(reason(f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1300, 1), "c301"))) ==
               "charged");
    auto dup = f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1300, 1), "c301", 2));
    BOOST_TEST(reason(dup) == "duplicate_prevented", dup.detail);
    auto republished = f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1300, 1), "c399"));
    BOOST_TEST(reason(republished) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(base + "-r1") == 1);

    BOOST_TEST(reason(f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1100, 2), "c302"))) ==
               "refunded");
    auto stale = f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 9999, 1), "c398"));
    BOOST_TEST(reason(stale) == "correction_noop", stale.detail);
    BOOST_TEST(stale.detail.find("superseded") == 0u, stale.detail);
    auto conflict = f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1000, 2), "c397"));
    BOOST_TEST(reason(conflict) == "dead_lettered");
    BOOST_TEST(f.dead_letters("c397") == 1);

    auto same = f.handle(*p, delivery_of(correction_json("cor-3", "2026-11", 1100, 3), "c303"));
    BOOST_TEST(reason(same) == "correction_noop", same.detail);
    BOOST_TEST(status_of(f, base + "-r3") == "applied");
    BOOST_TEST(f.fake->charges().size() == 2u);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(net_at_stripe(f) == 1100);
}

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

// A correction of a period whose original was declined moves nothing (nothing was charged to correct).
BOOST_AUTO_TEST_CASE(correction_of_a_declined_charge_is_a_no_op) {
    fixture f;
    auto p = f.make_pipeline();
    f.fake->decline("cus_ok");
    auto v0 = f.handle(*p, delivery_of(event_json("cor-9", "2026-11", 1000), "c900"));
    BOOST_TEST_REQUIRE(reason(v0) == "declined");
    auto v = f.handle(*p, delivery_of(correction_json("cor-9", "2026-11", 1500, 1), "c901"));
    BOOST_TEST(reason(v) == "correction_noop", v.detail);
    BOOST_TEST(f.fake->refunds().empty());
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

// A period paid through PaymentIntents: revision 1 raises it (its difference confirmed as a PaymentIntent
// of its own, under base-r1), revision 2 lowers it below the original. The refunds go to the intents'
// charges — newest first: revision 1's intent whole, then part of the original's — so Stripe records each
// refund against its PaymentIntent, and the ledger's moves name the intents.
BOOST_AUTO_TEST_CASE(payment_intent_period_is_corrected_against_its_intents) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-pi", "2026-11");
    auto v0 = f.handle(*p, delivery_of(intent_json("cor-pi", 1000, 0, "pm_card_visa"), "cp00"));
    BOOST_TEST_REQUIRE(reason(v0) == "charged", v0.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    auto pi0 = f.fake->intents()[0];

    auto v1 = f.handle(*p, delivery_of(intent_json("cor-pi", 1300, 1, "pm_card_visa"), "cp01"));
    BOOST_TEST(reason(v1) == "charged", v1.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 2u);
    auto pi1 = f.fake->intents()[1];
    BOOST_TEST(pi1.amount == 300);
    BOOST_TEST(pi1.status == "succeeded");
    BOOST_TEST(meta(pi1.metadata, "billing_key") == base + "-r1");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_correction_moves WHERE correction_key = $1 AND "
                        "payment_intent_id = '" +
                            pi1.id + "' AND stripe_object_id = '" + pi1.latest_charge + "'",
                        base + "-r1") == 1);

    auto v2 = f.handle(*p, delivery_of(intent_json("cor-pi", 500, 2, "pm_card_visa"), "cp02"));
    BOOST_TEST(reason(v2) == "refunded", v2.detail);
    BOOST_TEST_REQUIRE(f.fake->refunds().size() == 2u);
    const auto& r1 = f.fake->refunds()[0];
    const auto& r2 = f.fake->refunds()[1];
    BOOST_TEST(r1.charge == pi1.latest_charge);
    BOOST_TEST(r1.payment_intent == pi1.id);
    BOOST_TEST(r1.amount == 300);
    BOOST_TEST(r2.charge == pi0.latest_charge);
    BOOST_TEST(r2.payment_intent == pi0.id);
    BOOST_TEST(r2.amount == 500);
    BOOST_TEST(net_at_stripe(f) == 500);
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", base) == 500);
    BOOST_TEST(status_of(f, base + "-r2") == "applied");
}

// A bank debit settles later: while the original is processing no money has moved, so a correction neither
// counts it as charged nor refunds it — it waits (requeued, never dead-lettered, no Stripe call). Once the
// debit succeeds (here found by the processing poll) the correction refunds against it; a debit that fails
// instead leaves its correction waiting with nothing moved (a replay of the failure charges the original
// again under a new key, and the correction applies after that).
BOOST_AUTO_TEST_CASE(correction_of_a_processing_bank_debit_waits_until_it_settles) {
    fixture f;
    auto p = f.make_pipeline();
    auto base = key_of("cor-bank", "2026-11");
    auto fail_base = key_of("cor-bank-x", "2026-11");
    const std::string pm = "pm_usBankAccount_processing";  // processing until settled by hand
    BOOST_TEST_REQUIRE(reason(f.handle(*p, delivery_of(intent_json("cor-bank", 1000, 0, pm), "cb00"))) ==
                       "processing");
    BOOST_TEST_REQUIRE(reason(f.handle(*p, delivery_of(intent_json("cor-bank-x", 1000, 0, pm), "cbx0"))) ==
                       "processing");
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 2u);
    auto pi = f.fake->intents()[0];
    auto pi_x = f.fake->intents()[1];

    auto before = f.fake->requests();
    auto w = f.handle(*p, delivery_of(intent_json("cor-bank", 600, 1, pm), "cb01"));
    BOOST_TEST(reason(w) == "requeued_waiting", w.detail);
    BOOST_TEST(w.detail.find("processing") != std::string::npos, w.detail);
    BOOST_TEST(!w.finished());
    BOOST_TEST(f.fake->requests() == before);  // nothing asked of Stripe, nothing refunded
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", base) == 0);
    BOOST_TEST(f.dead_letters("cb01") == 0);

    BOOST_TEST_REQUIRE(f.fake->settle(pi.id, "succeeded"));
    BOOST_TEST_REQUIRE(f.fake->settle(pi_x.id, "failed", "insufficient_funds"));
    billing::poller_config pc;
    pc.poll_after = 0ms;
    pc.rate_per_second = 100;
    billing::settlement_poller poller(pc, f.pg, *f.stripe, logger());
    auto polled = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(polled.has_value(), (polled ? "" : polled.err().describe()));
    BOOST_TEST_REQUIRE(billing::to_string(f.row(base)->status) == "charged");
    BOOST_TEST_REQUIRE(billing::to_string(f.row(fail_base)->status) == "failed_after_processing");

    auto v = f.handle(*p, delivery_of(intent_json("cor-bank", 600, 1, pm), "cb01", 2));
    BOOST_TEST(reason(v) == "refunded", v.detail);
    BOOST_TEST_REQUIRE(f.fake->refunds().size() == 1u);
    BOOST_TEST(f.fake->refunds()[0].payment_intent == pi.id);
    BOOST_TEST(f.fake->refunds()[0].amount == 400);
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", base) == 600);

    auto wx = f.handle(*p, delivery_of(intent_json("cor-bank-x", 600, 1, pm), "cbx1"));
    BOOST_TEST(reason(wx) == "requeued_waiting", wx.detail);
    BOOST_TEST(f.fake->refunds().size() == 1u);
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", fail_base) == 0);
    BOOST_TEST(status_of(f, fail_base + "-r1") == "absent");  // recorded once its original is charged
}

BOOST_AUTO_TEST_SUITE_END()
