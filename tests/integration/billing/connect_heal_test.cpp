// Stripe Connect and the background healers, against real PostgreSQL and fake-stripe scoping every object per
// account as Stripe does: the sweeper, the settlement poller and the backfill each work a row in its own
// account, and never find another account's payment. g++ 12 -O2 false positive on Asio coroutine frames (GCC
// bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/heal/backfill.hpp"
#include "billing/heal/settlement_poller.hpp"
#include "billing/heal/sweeper.hpp"
#include "billing/machine/outcome.hpp"
#include "connect_support.hpp"
#include "fixture.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::reason;

namespace {

using namespace cg::test::connect_support;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_connect)

// The sweeper charges an abandoned Connect row (no message left) from what the row holds, account included.
BOOST_AUTO_TEST_CASE(sweeper_charges_an_abandoned_row_in_its_account) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    auto key = connect_key("shop-4", acct_b);
    abandoned_row(f, connect_event("shop-4", acct_b), "c401");
    billing::sweeper_config sc;
    sc.after = 0ms;
    sc.interval = 1h;
    billing::sweeper s(sc, *p, f.pg, logger());
    auto rep = f.run(s.sweep_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->count(billing::verdict_reason::charged) == 1u);
    BOOST_TEST_REQUIRE(charges_in(f, acct_b).size() == 1u);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.row(key)->charge_id.value_or("") == charges_in(f, acct_b)[0]->id);
}

// A bank debit on account A answered processing; the webhook never came. The poll retrieves the intent in A
// (elsewhere it does not exist) and settles the row.
BOOST_AUTO_TEST_CASE(poll_retrieves_a_processing_payment_in_its_account) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    auto body = connect_event("shop-5", acct_a, 2000, R"(,"payment_method":"pm_usBankAccount_processing")");
    auto key = connect_key("shop-5", acct_a);
    auto v = f.handle(*p, delivery_of(body, "c501"));
    BOOST_TEST(reason(v) == "processing", v.detail);
    BOOST_TEST_REQUIRE(f.fake->intents().size() == 1u);
    const auto intent = f.fake->intents()[0].id;
    BOOST_TEST(f.fake->intents()[0].account == acct_a);
    BOOST_TEST_REQUIRE(f.fake->settle(intent, "succeeded"));
    auto aged =
        f.run(f.query("UPDATE billing_records SET processing_since = now() - interval '2 hours' "
                      "WHERE key = $1",
                      pg::params(key)));
    BOOST_TEST_REQUIRE(aged.has_value());
    billing::poller_config pc;
    pc.poll_after = 1h;
    pc.rate_per_second = 50;
    billing::settlement_poller poller(pc, f.pg, *f.stripe, logger());
    auto polled = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(polled.has_value(), (polled ? "" : polled.err().describe()));
    BOOST_TEST(polled->errors == 0u);
    BOOST_TEST(polled->settled == 1u);
    BOOST_TEST(billing::to_string(f.row(key)->status) == "charged");
}

// A failover lost account B's charged row entirely (and the platform's of the same customer id). The backfill
// lists the platform, then each connected account the ledger knows (B, through its other row), and restores
// each row in its own account with its own charge.
BOOST_AUTO_TEST_CASE(backfill_restores_lost_rows_in_their_accounts) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    for (const auto& [customer, account] : std::vector<std::pair<std::string, std::string>>{
             {"shop-8", ""}, {"shop-8", acct_b}, {"shop-9", acct_b}}) {
        auto v = f.handle(*p, delivery_of(connect_event(customer, account), "c8" + customer + account));
        BOOST_TEST_REQUIRE(reason(v) == "charged", v.detail);
    }
    const auto lost_b = connect_key("shop-8", acct_b), lost_platform = connect_key("shop-8", "");
    auto gone = f.run(
        f.query("DELETE FROM billing_records WHERE key = $1 OR key = $2", pg::params(lost_b, lost_platform)));
    BOOST_TEST_REQUIRE(gone.has_value());
    billing::backfill_config bc;
    bc.key_namespace = test::key_namespace;
    bc.window = 1h;
    bc.topic = "billing";
    bc.channel = "chargeguard";
    billing::backfill b(bc, f.pg, *f.stripe, logger());
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->inserted == 2u);
    for (const auto& [key, account] : {std::pair{lost_b, acct_b}, std::pair{lost_platform, std::string()}}) {
        auto rec = f.row(key);
        BOOST_TEST_REQUIRE(rec.has_value(), account);
        BOOST_TEST(billing::to_string(rec->status) == "charged");
        BOOST_TEST(rec->stripe_account == account);
        auto in_account = charges_in(f, account);
        bool its_own = false;
        for (const auto* c : in_account) its_own = its_own || c->id == rec->charge_id.value_or("");
        BOOST_TEST(its_own, account);
    }
    BOOST_TEST(f.fake->charges().size() == 3u);
}

// A failover lost every row of account A: the ledger no longer names A, so a backfill that searches only the
// platform and the accounts the ledger knows finds nothing of A (the platform's row of the same customer id
// is whole). With A configured (consume --connect-accounts) the backfill searches it too and restores the row
// in A with A's charge; the platform's row and B's are left as they were.
BOOST_AUTO_TEST_CASE(backfill_searches_configured_accounts_the_ledger_lost) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    for (const auto& [customer, account] : std::vector<std::pair<std::string, std::string>>{
             {"shop-7", ""}, {"shop-7", acct_a}, {"shop-6", acct_b}}) {
        auto v = f.handle(*p, delivery_of(connect_event(customer, account), "c7" + customer + account));
        BOOST_TEST_REQUIRE(reason(v) == "charged", v.detail);
    }
    const auto lost = connect_key("shop-7", acct_a);
    auto gone = f.run(f.query("DELETE FROM billing_records WHERE stripe_account = $1", pg::params(acct_a)));
    BOOST_TEST_REQUIRE(gone.has_value());
    billing::backfill_config bc;
    bc.key_namespace = test::key_namespace;
    bc.window = 1h;
    bc.topic = "billing";
    bc.channel = "chargeguard";
    {
        billing::backfill unaware(bc, f.pg, *f.stripe, logger());
        auto rep = f.run(unaware.run_once());
        BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
        BOOST_TEST(rep->inserted == 0u);
        BOOST_TEST(!f.row(lost).has_value());
    }
    bc.connect_accounts = {acct_b, acct_a};  // B the ledger knows too: searched once
    billing::backfill b(bc, f.pg, *f.stripe, logger());
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->inserted == 1u);
    BOOST_TEST(rep->listed == 3u);  // one charge in each of the platform, B and A
    auto rec = f.row(lost);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->stripe_account == acct_a);
    auto in_a = charges_in(f, acct_a);
    BOOST_TEST_REQUIRE(in_a.size() == 1u);
    BOOST_TEST(rec->charge_id.value_or("") == in_a[0]->id);
    BOOST_TEST(f.fake->charges().size() == 3u);
    auto platform = f.row(connect_key("shop-7", ""));
    BOOST_TEST_REQUIRE(platform.has_value());
    BOOST_TEST(platform->stripe_account == "");
    BOOST_TEST(platform->charge_id.value_or("") == charges_in(f, "")[0]->id);
}

BOOST_AUTO_TEST_SUITE_END()
