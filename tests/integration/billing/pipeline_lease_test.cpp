// The pipeline and the ledger's lease against real PostgreSQL and fake-stripe: a lease held elsewhere
// requeues without calling Stripe, a stale row takes the next key generation only when no call under the old
// one may be in flight, the lease is renewed through a slow Stripe call and a lease taken over is counted,
// and group commit lingers by the pace of Stripe's calls.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "pipeline_support.hpp"
#include "stripe/types.hpp"
#include "support/prom_text.hpp"

using namespace std::chrono_literals;
using namespace cg;
using billing::verdict_reason;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::first_sample;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;
using cg::test::unlabelled;
using cg::test::watch_pending_age;

namespace {

using fixture = test::billing_fixture;

// Runs one delivery to completion and wakes `done` (a timer used as an event).
net::awaitable<void> handle_into(billing::charge_flow* p, billing::delivery d,
                                 std::optional<billing::verdict>* out, net::steady_timer* done) {
    *out = co_await p->handle(std::move(d));
    done->cancel();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_pipeline)

// A pending row whose first attempt is past the 23 h window (pipeline and fake-stripe clocks moved 25 h) and
// no charge at Stripe: the search finds none, the generation is bumped, one charge under "<base>-g2".
BOOST_AUTO_TEST_CASE(stale_pending_row_without_charge_takes_generation_two) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-7", "2026-11", 800);
    auto key = key_of("acme-7", "2026-11");
    f.fake->faults().rate_limit = 3;  // the first try and both client retries: 429, nothing saved
    auto v = f.handle(*p, delivery_of(body, "1001", 1));
    BOOST_TEST(reason(v) == "requeued_retry_same_key", v.detail);
    BOOST_TEST(v.delay == 102ms);
    BOOST_TEST(f.fake->charges().empty());
    BOOST_TEST(f.row(key)->stripe_attempts == 1);

    f.clock_offset = std::chrono::hours(25);
    f.fake->advance_clock(std::chrono::hours(25));
    auto v2 = f.handle(*p, delivery_of(body, "1001", 2));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 3);          // only the 429s
    BOOST_TEST(f.fake->posts_for(key + "-g2") == 1);  // the new generation
    stripe::metadata md(f.fake->charges()[0].metadata.begin(), f.fake->charges()[0].metadata.end());
    BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == key);  // always the base key
    auto rec = f.row(key);
    BOOST_TEST(rec->key_generation == 2);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
}

// Another worker holds the lease: REQ until that lease can have expired (not a fixed short delay that burns
// NSQ attempts), no Stripe call, row untouched.
BOOST_AUTO_TEST_CASE(lease_held_elsewhere_requeues_without_calling_stripe) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-8", "2026-11", 900);
    auto key = key_of("acme-8", "2026-11");
    auto other = f.dead_workers_row(body, "other", 60s);  // alive here: it holds a 60 s lease
    auto v = f.handle(*p, delivery_of(body, "1101", 2));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_lease_held");
    // The other worker's 60 s lease has (almost) all of its time left: wait that long, plus ≤ 10 % jitter.
    BOOST_TEST(v.delay >= 58s, v.delay.count());
    BOOST_TEST(v.delay <= 66s, v.delay.count());
    BOOST_TEST(f.fake->requests() == 0u);
    auto rec = f.row(key);
    BOOST_TEST(rec->stripe_attempts == 1);  // the other worker's pre-flight; nothing added by this delivery
    BOOST_TEST((rec->lease_until == other.lease_until));
}

// The ledger's group-commit wait follows Stripe's pace: 1 % of the exponential average (weight 1/16) of the
// Stripe call time, capped by group_commit_linger_max, and never a wait when the cap is 0.
BOOST_AUTO_TEST_CASE(group_commit_linger_follows_stripe_call_time) {
    fixture f;
    BOOST_TEST(f.ledger->linger().count() == 0);  // no Stripe call yet: no wait
    f.fake->faults().latency_ms = 200;
    auto p = f.make_pipeline();
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-lg1", "2026-11", 1000), "1a01"))) ==
               "charged");
    // One 200 ms call: average 200 ms / 16 = 12.5 ms, so 125 µs (a little more: the call took ≥ 200 ms).
    auto one = f.ledger->linger();
    BOOST_TEST(one >= std::chrono::microseconds(125));
    BOOST_TEST(one < std::chrono::microseconds(250));
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-lg2", "2026-11", 1000), "1a02"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger() > one);  // the average climbs towards the call time

    auto capped = f.config_for_pipeline();
    capped.group_commit_linger_max = std::chrono::microseconds(40);
    auto q = f.make_pipeline(capped);
    BOOST_TEST(reason(f.handle(*q, delivery_of(event_json("acme-lg3", "2026-11", 1000), "1a03"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger() == std::chrono::microseconds(40));

    auto off = f.config_for_pipeline();
    off.group_commit_linger_max = std::chrono::microseconds(0);
    auto z = f.make_pipeline(off);
    BOOST_TEST(reason(f.handle(*z, delivery_of(event_json("acme-lg4", "2026-11", 1000), "1a04"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger().count() == 0);
}

// Stripe slower than the lease: the lease is renewed while the call is awaited, so a second pipeline handling
// a redelivery meanwhile sees "lease held" and never POSTs. Without renewal it would take the expired lease
// and POST under the same key (409 in use here; a second charge after a new generation in general).
BOOST_AUTO_TEST_CASE(lease_is_renewed_during_a_slow_stripe_call) {
    fixture f;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 1000ms;
    cfg.lease_renew_interval = 200ms;
    auto a = f.make_pipeline(cfg);
    auto b = f.make_pipeline(cfg);
    f.fake->faults().latency_ms = 3000;  // the 7th renewal (≈ 1.4 s) comes well before the answer
    auto body = event_json("acme-11", "2026-11", 1400);
    auto key = key_of("acme-11", "2026-11");

    std::optional<billing::verdict> va, vb;
    net::steady_timer b_done(f.io, std::chrono::steady_clock::time_point::max());
    int touches = 0;
    // At the 7th touch (≈ 1.4 s into the call, past the 1 s lease) the redelivery arrives at the other
    // instance.
    billing::touch_fn touch = [&] {
        if (++touches == 7)
            asio::co_spawn(f.io, handle_into(b.get(), delivery_of(body, "1401", 2), &vb, &b_done),
                           asio::detached);
    };
    va = run_async(f.io, [&]() -> net::awaitable<billing::verdict> {
        auto v = co_await a->handle(delivery_of(body, "1401", 1), touch);
        if (!vb) co_await b_done.async_wait();  // cancelled when b finishes
        co_return v;
    });
    BOOST_TEST(touches >= 7);
    BOOST_TEST_REQUIRE(vb.has_value());
    BOOST_TEST(reason(*vb) == "requeued_lease_held", vb->detail);
    BOOST_TEST(reason(*va) == "charged", va->detail);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Another worker takes the row's lease while Stripe is still answering (its epoch moves): the next renewal
// finds it gone, counts it, and notes the call in flight instead of renewing; the one charge is still made.
BOOST_AUTO_TEST_CASE(a_lease_taken_over_during_the_call_is_counted) {
    fixture f;
    metrics::registry reg;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 5000ms;
    cfg.lease_renew_interval = 200ms;
    auto p = f.make_pipeline(cfg, &reg);
    f.fake->faults().latency_ms = 3000;
    auto body = event_json("acme-lost", "2026-11", 1450);
    auto key = key_of("acme-lost", "2026-11");

    bool taken = false;
    auto touch = f.take_lease_at_second_touch("billing_records", key, &taken);
    auto v = run_async(f.io, [&]() { return p->handle(delivery_of(body, "1451", 1), touch); });
    BOOST_TEST_REQUIRE(taken);
    BOOST_TEST(unlabelled(reg, "chargeguard_billing_lease_lost_total") == 1.0);
    BOOST_TEST(f.fake->posts_for(key) == 1, reason(v));
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Recovery searched and found no charge, but the call under the current key showed life moments ago (its
// worker may have lost the lease while Stripe still works on it): no new generation yet — the row is
// requeued for when that call cannot charge any more, and only then charged under generation 2.
BOOST_AUTO_TEST_CASE(no_new_generation_while_a_call_under_the_old_one_may_be_in_flight) {
    fixture f;
    auto cfg = f.config_for_pipeline();
    cfg.new_key_quiet = 60s;
    auto p = f.make_pipeline(cfg);
    auto body = event_json("acme-19", "2026-11", 2200);
    auto rec = f.dead_workers_row(body, "1903", 30s);
    auto marked = f.run(f.ledger->mark_indeterminate(rec.key, rec.lease_epoch, "after sending: timeout"));
    BOOST_TEST_REQUIRE((marked.has_value() && *marked));
    auto v = f.handle(*p, delivery_of(body, "1903", 2));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST(v.delay.count() > 55'000);
    BOOST_TEST(v.delay.count() <= 60'100);
    auto after = f.row(rec.key);
    BOOST_TEST(after->key_generation == 1);
    BOOST_TEST(!after->lease_remaining.value_or(0ms).count());  // handed back at once
    BOOST_TEST(f.fake->posts_for(rec.key + "-g2") == 0);
    // A minute later nothing under the old key can still charge: generation 2, charged once.
    f.age_last_attempt(rec.key);
    auto v2 = f.handle(*p, delivery_of(body, "1903", 3));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    BOOST_TEST(f.row(rec.key)->key_generation == 2);
    BOOST_TEST(f.fake->posts_for(rec.key + "-g2") == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
