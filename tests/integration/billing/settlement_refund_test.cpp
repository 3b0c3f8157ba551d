// Refunds and disputes of a payment that settled later, end to end on real PostgreSQL: Stripe's refund and
// dispute events, recorded and applied by billing::settlement_store as the webhook receiver does, in every
// order and with duplicates, count each refund once and give a failed refund's amount back. Stripe is the
// in-test double of settlement_support.hpp.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>
#include <boost/test/unit_test.hpp>

#include "billing/store/settlement_store.hpp"
#include "fixture.hpp"
#include "settlement_support.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::key_of;
using cg::test::reason;

namespace {

using namespace cg::test::settle_support;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_settlement)

// Refunds and disputes in every order of a succeeded payment's events: charged, with the full refund and
// the lost dispute, whatever came first; a succeeded replayed after the refund changes nothing.
BOOST_AUTO_TEST_CASE(refunds_and_disputes_in_every_order) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto seed = f.processing_row("refund-seed", *p);
    std::vector<int> idx{0, 1, 2, 3, 4};
    int n = 0;
    do {
        std::string customer = "refund-" + std::to_string(++n);
        auto pi = f.processing_row(customer, *p);
        auto key = key_of(customer, "2026-12");
        std::vector<std::string> events{
            f.event("payment_intent.succeeded", pi, "succeeded"),
            f.event("charge.refunded", pi, "succeeded", 500),
            f.event("charge.refunded", pi, "succeeded", 1999),
            f.event("charge.dispute.created", pi, "needs_response"),
            f.event("charge.dispute.closed", pi, "lost"),
        };
        for (int i : idx) f.deliver(events[static_cast<std::size_t>(i)]);
        f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));  // replayed after the refund
        BOOST_TEST_CONTEXT("order " << n) {
            BOOST_TEST(
                f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'charged' AND "
                         "refunded_cents = 1999 AND disputed_cents = 1999 AND dispute_status = 'lost' "
                         "AND charge_id = $2",
                         key, pi.latest_charge) == 1);
        }
    } while (std::next_permutation(idx.begin(), idx.end()) && n < 40);
    // The seed row saw none of these events: each applies to the row its ids name.
    BOOST_TEST(f.status_of(key_of("refund-seed", "2026-12")) == "processing");
    (void)seed;
}

// A refund object event (refund.created, refund.updated, charge.refund.updated) about refund
// `re` of `pi`'s charge.
std::string refund_event(settle_fixture& f, const std::string& type, const async_intent& pi,
                         const std::string& re, std::int64_t amount, const std::string& status,
                         std::int64_t created = 1700000100) {
    std::string obj = R"({"id":")" + re + R"(","object":"refund","amount":)" + std::to_string(amount) +
                      R"(,"charge":")" + pi.latest_charge + R"(","payment_intent":")" + pi.id +
                      R"(","currency":"usd","status":")" + status + R"(","metadata":{}})";
    return R"({"id":"evt_r)" + std::to_string(++f.event_seq) + R"(","object":"event","type":")" + type +
           R"(","created":)" + std::to_string(created) + R"(,"livemode":false,"data":{"object":)" + obj +
           "}}";
}

std::int64_t refunded_of(settle_fixture& f, const std::string& key) {
    return f.scalar("SELECT refunded_cents FROM billing_records WHERE key = $1 AND status = 'charged'", key);
}

// One refund reported by its charge (charge.refunded, cumulative) and by itself (refund.created, then
// refund.updated succeeded), in every order, each delivered twice: it counts once. The same with the
// refund ending failed (refund.updated): in every order it gives its amount back, whatever came after.
BOOST_AUTO_TEST_CASE(one_refund_by_its_charge_and_by_its_id_counts_once_in_every_order) {
    settle_fixture f;
    auto p = f.async_pipeline();
    for (bool fails : {false, true}) {
        std::vector<int> idx{0, 1, 2};
        if (fails) idx.push_back(3);
        int n = 0;
        do {
            std::string customer = std::string(fails ? "rf-fail-" : "rf-ok-") + std::to_string(++n);
            auto pi = f.processing_row(customer, *p);
            auto key = key_of(customer, "2026-12");
            f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));
            const std::string re = "re_" + customer;
            std::vector<std::string> events{
                f.event("charge.refunded", pi, "succeeded", 600, 1700000050),
                refund_event(f, "refund.created", pi, re, 600, "pending", 1700000050),
                refund_event(f, "refund.updated", pi, re, 600, "succeeded", 1700000060),
                refund_event(f, "refund.updated", pi, re, 600, "failed", 1700000070),
            };
            for (int i : idx) {
                auto first = f.deliver(events[static_cast<std::size_t>(i)]);
                BOOST_TEST(!first.duplicate);
                BOOST_TEST(f.deliver(events[static_cast<std::size_t>(i)]).duplicate);
            }
            BOOST_TEST_CONTEXT((fails ? "failing" : "succeeding") << " order " << n) {
                BOOST_TEST(refunded_of(f, key) == (fails ? 0 : 600));
                BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_refunds WHERE id = $1 AND status = $2", re,
                                    std::string(fails ? "failed" : "succeeded")) == 1);
            }
        } while (std::next_permutation(idx.begin(), idx.end()));
    }
}

// Several refunds of one charge, their events interleaved and late: each counts once by its id; one that
// fails (refund.updated) or is canceled (charge.refund.updated) gives its amount back, and a late
// charge.refunded with the higher cumulative amount, or a late refund.created of the failed refund, does not
// bring it back. A refund.created arriving before its charge.refunded counts at once.
BOOST_AUTO_TEST_CASE(several_refunds_their_failures_and_late_events) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("rf-multi", *p);
    auto key = key_of("rf-multi", "2026-12");
    f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));
    BOOST_TEST(refunded_of(f, key) == 0);
    auto r = f.deliver(refund_event(f, "refund.created", pi, "re_a", 500, "succeeded", 1700000100));
    BOOST_TEST(r.outcome == "applied");
    BOOST_TEST(refunded_of(f, key) == 500);
    r = f.deliver(f.event("charge.refunded", pi, "succeeded", 500, 1700000100));  // the same refund
    BOOST_TEST(r.outcome == "no_change");
    BOOST_TEST(refunded_of(f, key) == 500);
    f.deliver(refund_event(f, "refund.created", pi, "re_b", 300, "pending", 1700000200));
    BOOST_TEST(refunded_of(f, key) == 800);
    f.deliver(f.event("charge.refunded", pi, "succeeded", 800, 1700000200));
    BOOST_TEST(refunded_of(f, key) == 800);
    // re_b fails: its 300 comes back.
    f.deliver(refund_event(f, "refund.updated", pi, "re_b", 300, "failed", 1700000300));
    BOOST_TEST(refunded_of(f, key) == 500);
    // Late: charge.refunded at 800 again (a new event), re_b's refund.updated pending, a refund.created.
    f.deliver(f.event("charge.refunded", pi, "succeeded", 800, 1700000210));
    f.deliver(refund_event(f, "refund.updated", pi, "re_b", 300, "pending", 1700000250));
    f.deliver(refund_event(f, "refund.created", pi, "re_b", 300, "pending", 1700000200));
    BOOST_TEST(refunded_of(f, key) == 500);
    // re_a canceled (charge.refund.updated): nothing is refunded any more.
    f.deliver(refund_event(f, "charge.refund.updated", pi, "re_a", 500, "canceled", 1700000400));
    BOOST_TEST(refunded_of(f, key) == 0);
    // A third refund known first only by its charge's newer cumulative amount (the two given back are not
    // in it): it counts at once, and its own event later does not count it again.
    f.deliver(f.event("charge.refunded", pi, "succeeded", 400, 1700000500));
    BOOST_TEST(refunded_of(f, key) == 400);
    f.deliver(refund_event(f, "refund.created", pi, "re_c", 400, "succeeded", 1700000500));
    BOOST_TEST(refunded_of(f, key) == 400);
    BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_refunds WHERE charge_id = $1", pi.latest_charge) == 3);
    BOOST_TEST(f.status_of(key) == "charged");
}

BOOST_AUTO_TEST_SUITE_END()
