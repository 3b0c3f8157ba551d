// The pipeline's last attempt against real PostgreSQL and fake-stripe: past max attempts a valid event is
// charged (after a dead worker's lease ran out) or its indeterminate attempt resolved by search instead of
// being dead-lettered; an invalid one is dead-lettered with its reason.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "pipeline_support.hpp"
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

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_pipeline)

// Past max attempts a valid event is not poison: it goes through the machine like any delivery and is
// charged — never dead-lettered "max attempts exceeded" — and the delivery is counted so an operator sees it.
BOOST_AUTO_TEST_CASE(give_up_charges_a_valid_event_instead_of_dead_lettering_it) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline(f.config_for_pipeline(), &reg);
    auto body = event_json("acme-12", "2026-11", 1500);
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1501", 10)); });
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.dead_letters("1501") == 0);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(unlabelled(reg, "chargeguard_billing_past_max_attempts_total") == 1.0);
}

// Past max attempts, an event that can never succeed is still dead-lettered, with its real reason.
BOOST_AUTO_TEST_CASE(give_up_dead_letters_an_invalid_event_with_its_reason) {
    fixture f;
    auto p = f.make_pipeline();
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of("{\"customer_id\": 7}", "1502", 10)); });
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1502' AND "
                        "reason LIKE 'event%'") == 1);
    BOOST_TEST(f.fake->requests() == 0u);
}

// The chaos-run loss: a worker wrote the row and died before Stripe heard of it; the redelivery came back
// past max attempts while the dead worker's lease still ran. Today's answer: requeue until the lease can
// have expired (no letter, no Stripe call), then recover and charge — never dead-letter and leave it pending.
BOOST_AUTO_TEST_CASE(past_max_attempts_with_a_dead_workers_lease_waits_for_it_then_charges) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-13", "2026-11", 1600);
    auto key = key_of("acme-13", "2026-11");
    f.dead_workers_row(body, "1601", 1500ms);  // the dead worker's pre-flight, 1.5 s lease
    auto held = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1601", 6)); });
    BOOST_TEST(!held.finished());
    BOOST_TEST(reason(held) == "requeued_lease_held", held.detail);
    BOOST_TEST(held.delay >= 1000ms, held.delay.count());          // until the dead worker's lease can expire
    BOOST_TEST(held.delay <= 1500ms + 150ms, held.delay.count());  // + at most 10 % jitter
    BOOST_TEST(f.dead_letters("1601") == 0);
    BOOST_TEST(f.fake->requests() == 0u);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'pending'", key) ==
               1);

    // nsqd redelivers after that delay (a timer stands in for the REQ timeout).
    run_async(f.io, [&]() -> net::awaitable<void> {
        net::steady_timer t(co_await asio::this_coro::executor, held.delay);
        co_await t.async_wait();
    });
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1601", 7)); });
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.dead_letters("1601") == 0);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(billing::to_string(f.row(key)->status) == "charged");
}

// Past max attempts with an indeterminate Stripe answer: the machine resolves it by search → charged, no
// letter, one charge.
BOOST_AUTO_TEST_CASE(give_up_resolves_an_indeterminate_attempt_by_search) {
    fixture f;
    auto p = f.make_pipeline();
    auto body2 = event_json("acme-14", "2026-11", 1700);
    auto key2 = key_of("acme-14", "2026-11");
    f.fake->faults().fail_after_create = 1;
    BOOST_TEST(reason(f.handle(*p, delivery_of(body2, "1602", 1))) == "requeued_indeterminate");
    auto resolved = run_async(f.io, [&]() { return p->give_up(delivery_of(body2, "1602", 10)); });
    BOOST_TEST(reason(resolved) == "charged", resolved.detail);
    BOOST_TEST(f.dead_letters("1602") == 0);
    BOOST_TEST(f.fake->posts_for(key2) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
