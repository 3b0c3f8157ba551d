// Corrections (docs/design.md §4a) end to end: real PostgreSQL (migrations applied), fake-stripe over TLS,
// the real stripe::client and the pipeline. Each test names the failure it would catch. g++ 12 -O2 false
// positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/heal/pending_age.hpp"
#include "billing/heal/settlement_poller.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/store/correction_ledger.hpp"
#include "correction_support.hpp"
#include "fixture.hpp"
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

// Net money at Stripe for a customer: charges that succeeded less refunds that stand.
std::int64_t net_at_stripe(const fixture& f) {
    std::int64_t sum = 0;
    for (const auto& c : f.fake->charges())
        if (c.status == "succeeded") sum += c.amount - c.amount_refunded;
    return sum;
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
