// Stripe Connect end to end: events charged on behalf of connected accounts (`stripe_account`, sent as the
// Stripe-Account header), against real PostgreSQL and fake-stripe scoping every object, idempotency key and
// customer per account as Stripe does. Two accounts with the same customer id and period are two charges,
// each made once and found again only in its own account. g++ 12 -O2 false positive on Asio coroutine frames
// (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "connect_support.hpp"
#include "fixture.hpp"
#include "stripe/types.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::reason;

namespace {

using namespace cg::test::connect_support;

// A charge made straight at Stripe in `account` carrying `billing_key` in its metadata: another account's
// payment (or the platform's) that a search not scoped to the row's account would adopt.
std::string decoy_charge(fixture& f, const std::string& account, const std::string& billing_key,
                         const std::string& idem) {
    stripe::charge_request r;
    r.amount = 1500;
    r.currency = "usd";
    r.customer = "cus_ok";
    r.metadata = {{"billing_key", billing_key}, {"customer_id", "shop-x"}, {"billing_period", "2026-11"}};
    r.idempotency_key = idem;
    r.stripe_account = account;
    auto out = f.run(f.stripe->create_charge(std::move(r)));
    BOOST_TEST_REQUIRE((out.cls == stripe::outcome_class::succeeded), out.message);
    return out.charge_id;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_connect)

// The same customer id and period on the platform and on two connected accounts: three keys, three rows,
// three charges — each in its own account, under its own key, once — and every redelivery a prevented
// duplicate. The platform's key is the one it always was.
BOOST_AUTO_TEST_CASE(two_accounts_same_customer_and_period_each_charged_once) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    const std::vector<std::string> accounts{"", acct_a, acct_b};
    for (std::size_t i = 0; i < accounts.size(); ++i) {
        auto v = f.handle(*p, delivery_of(connect_event("shop-1", accounts[i]), "c0" + std::to_string(i)));
        BOOST_TEST(reason(v) == "charged", accounts[i] << ": " << v.detail);
    }
    BOOST_TEST(connect_key("shop-1", "") == test::key_of("shop-1", "2026-11"));
    for (const auto& account : accounts) {
        auto key = connect_key("shop-1", account);
        auto in_account = charges_in(f, account);
        BOOST_TEST_REQUIRE(in_account.size() == 1u, account);
        stripe::metadata md(in_account[0]->metadata.begin(), in_account[0]->metadata.end());
        BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == key);
        auto rec = f.row(key);
        BOOST_TEST_REQUIRE(rec.has_value(), account);
        BOOST_TEST(billing::to_string(rec->status) == "charged");
        BOOST_TEST(rec->stripe_account == account);
        BOOST_TEST(rec->charge_id.value_or("") == in_account[0]->id);
        BOOST_TEST(f.fake->posts_for(key) == 1);
    }
    // Redeliveries, under the original and another message id: nothing is sent to Stripe again.
    for (std::size_t i = 0; i < accounts.size(); ++i) {
        auto body = connect_event("shop-1", accounts[i]);
        BOOST_TEST(reason(f.handle(*p, delivery_of(body, "c0" + std::to_string(i), 2))) ==
                   "duplicate_prevented");
        BOOST_TEST(reason(f.handle(*p, delivery_of(body, "c1" + std::to_string(i), 1))) ==
                   "duplicate_prevented");
    }
    BOOST_TEST(f.fake->charges().size() == 3u);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE customer_id = 'shop-1'") == 3);
}

// A 500 after the charge was made in account A leaves the row pending and indeterminate. Before the
// redelivery, account B and the platform hold newer charges carrying A's billing key. The search runs in A
// only: it finds A's charge and records it — no second charge in A, and no other account's payment adopted.
BOOST_AUTO_TEST_CASE(indeterminate_answer_is_resolved_by_a_search_in_its_own_account) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    auto body = connect_event("shop-2", acct_a);
    auto key = connect_key("shop-2", acct_a);
    f.fake->faults().fail_after_create = 1;
    auto v = f.handle(*p, delivery_of(body, "c201", 1));
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST_REQUIRE(charges_in(f, acct_a).size() == 1u);
    auto made = charges_in(f, acct_a)[0]->id;
    auto decoy_b = decoy_charge(f, acct_b, key, "decoy-b");
    auto decoy_platform = decoy_charge(f, "", key, "decoy-platform");

    auto v2 = f.handle(*p, delivery_of(body, "c201", 2));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    auto rec = f.row(key);
    BOOST_TEST(rec->charge_id.value_or("") == made);
    BOOST_TEST(rec->key_generation == 1);
    BOOST_TEST(charges_in(f, acct_a).size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(rec->charge_id.value_or("") != decoy_b);
    BOOST_TEST(rec->charge_id.value_or("") != decoy_platform);
}

// A crash before settle left account A's row pending past Stripe's replay window, with nothing charged in A.
// The platform and account B hold charges carrying A's billing key; neither is adopted: the search in A finds
// none, and a new key generation charges once, in A.
BOOST_AUTO_TEST_CASE(crash_before_settle_never_adopts_another_accounts_charge) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    auto body = connect_event("shop-3", acct_a);
    auto key = connect_key("shop-3", acct_a);
    abandoned_row(f, body, "c301");
    auto decoy_b = decoy_charge(f, acct_b, key, "decoy-b3");
    auto decoy_platform = decoy_charge(f, "", key, "decoy-p3");
    f.clock_offset = 25h;  // past the 23 h same-key window: recovery searches first
    f.fake->advance_clock(25h);

    auto v = f.handle(*p, delivery_of(body, "c301", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    auto in_a = charges_in(f, acct_a);
    BOOST_TEST_REQUIRE(in_a.size() == 1u);
    auto rec = f.row(key);
    BOOST_TEST(rec->key_generation == 2);
    BOOST_TEST(rec->charge_id.value_or("") == in_a[0]->id);
    BOOST_TEST(f.fake->posts_for(key + "-g2") == 1);
    BOOST_TEST(rec->charge_id.value_or("") != decoy_b);
    BOOST_TEST(rec->charge_id.value_or("") != decoy_platform);
}

// Corrections of a Connect event: revision 1 raises account A's total (the difference charged in A, under
// A's base key + "-r1"), revision 2 lowers it below the original (refunded in A, newest payment first). The
// platform's charge of the same customer id and period, and B's, are untouched: no refund, no correction
// row, no second charge. A correction with the platform's (or another account's) scope would charge or
// refund the wrong account's payment, or be refused by Stripe for a charge it cannot see.
BOOST_AUTO_TEST_CASE(corrections_of_a_connect_event_move_money_in_its_account_only) {
    fixture f;
    connect_accounts(f);
    auto p = f.make_pipeline();
    for (const auto& account : {std::string(), acct_a, acct_b}) {
        auto v = f.handle(*p, delivery_of(connect_event("shop-5", account, 1000), "c5o" + account));
        BOOST_TEST_REQUIRE(reason(v) == "charged", v.detail);
    }
    const auto base = connect_key("shop-5", acct_a), platform_base = connect_key("shop-5", "");
    const auto orig_a = f.row(base)->charge_id.value_or("");
    const auto orig_platform = f.row(platform_base)->charge_id.value_or("");
    const auto orig_b = f.row(connect_key("shop-5", acct_b))->charge_id.value_or("");

    auto v1 = f.handle(*p, delivery_of(connect_event("shop-5", acct_a, 1500, R"(,"revision":1)"), "c5r1"));
    BOOST_TEST(reason(v1) == "charged", v1.detail);
    auto in_a = charges_in(f, acct_a);
    BOOST_TEST_REQUIRE(in_a.size() == 2u);
    const fake::charge_rec* rise = in_a[0]->id == orig_a ? in_a[1] : in_a[0];
    BOOST_TEST(rise->amount == 500);
    stripe::metadata md(rise->metadata.begin(), rise->metadata.end());
    BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == base + "-r1");
    BOOST_TEST(stripe::metadata_value(md, "corrects").value_or("") == base);

    auto v2 = f.handle(*p, delivery_of(connect_event("shop-5", acct_a, 700, R"(,"revision":2)"), "c5r2"));
    BOOST_TEST(reason(v2) == "refunded", v2.detail);
    std::int64_t refunded_a = 0;
    for (const auto& r : f.fake->refunds()) {
        BOOST_TEST(r.account == acct_a, r.id);
        BOOST_TEST((r.charge == orig_a || r.charge == rise->id), r.charge);
        refunded_a += r.amount;
    }
    BOOST_TEST(refunded_a == 800);  // 1500 → 700: the rise's 500 whole, then 300 of the original
    BOOST_TEST(f.scalar("SELECT cg_correction_net_cents($1)", base) == 700);

    // The platform and B: one charge each, of 1000, nothing refunded, no correction recorded.
    for (const auto& [account, id] : {std::pair{std::string(), orig_platform}, std::pair{acct_b, orig_b}}) {
        auto in = charges_in(f, account);
        BOOST_TEST_REQUIRE(in.size() == 1u, account);
        BOOST_TEST(in[0]->id == id);
        BOOST_TEST(in[0]->amount == 1000);
        BOOST_TEST(in[0]->amount_refunded == 0);
    }
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_corrections WHERE base_key <> $1", base) == 0);
    BOOST_TEST(f.fake->posts_for(platform_base + "-r1") == 0);
    BOOST_TEST(billing::to_string(f.row(platform_base)->status) == "charged");
}

// fake-stripe scopes as Stripe does: an account the platform does not reach is 403 account_invalid (our
// setup: the row stays pending, nothing is dead-lettered); a customer the account does not have is 400
// resource_missing (the request as sent is refused: failed + dead letter); an idempotency key is per account
// (the same key on two accounts makes two charges, not a replay).
BOOST_AUTO_TEST_CASE(fake_stripe_scopes_accounts_like_stripe) {
    fixture f;
    f.fake->add_account(acct_a, {"cus_ok"});
    f.fake->add_account(acct_b, {"cus_other"});
    auto p = f.make_pipeline();

    auto v = f.handle(*p, delivery_of(connect_event("shop-6", "acct_1Unknown"), "c601"));
    BOOST_TEST(!v.finished());
    BOOST_TEST(v.detail.find("account_invalid") != std::string::npos, v.detail);
    BOOST_TEST(billing::to_string(f.row(connect_key("shop-6", "acct_1Unknown"))->status) == "pending");
    BOOST_TEST(f.dead_letters("c601") == 0);

    auto v2 = f.handle(*p, delivery_of(connect_event("shop-7", acct_b), "c701"));
    BOOST_TEST(v2.finished());
    BOOST_TEST(reason(v2) == "dead_lettered", v2.detail);
    BOOST_TEST(v2.detail.find("No such customer") != std::string::npos, v2.detail);
    BOOST_TEST(billing::to_string(f.row(connect_key("shop-7", acct_b))->status) == "failed");
    BOOST_TEST(f.fake->charges().empty());

    f.fake->add_account(acct_b, {"cus_ok"});
    auto first = f.run(f.stripe->create_charge([&] {
        auto r = test::charge_req("same-key");
        r.stripe_account = acct_a;
        return r;
    }()));
    auto second = f.run(f.stripe->create_charge([&] {
        auto r = test::charge_req("same-key");
        r.stripe_account = acct_b;
        return r;
    }()));
    BOOST_TEST_REQUIRE((first.cls == stripe::outcome_class::succeeded));
    BOOST_TEST_REQUIRE((second.cls == stripe::outcome_class::succeeded));
    BOOST_TEST(!second.replayed);
    BOOST_TEST(first.charge_id != second.charge_id);
    // Each visible only in its own account.
    auto in_a = f.run(f.stripe->retrieve_charge_if_any(first.charge_id, acct_a));
    auto from_b = f.run(f.stripe->retrieve_charge_if_any(first.charge_id, acct_b));
    auto from_platform = f.run(f.stripe->retrieve_charge_if_any(first.charge_id));
    BOOST_TEST_REQUIRE(in_a.has_value());
    BOOST_TEST(in_a->has_value());
    BOOST_TEST_REQUIRE(from_b.has_value());
    BOOST_TEST(!from_b->has_value());
    BOOST_TEST_REQUIRE(from_platform.has_value());
    BOOST_TEST(!from_platform->has_value());
    // The Connect events name their account; the platform's would not.
    int named = 0;
    for (const auto& e : f.fake->events())
        if (e.object_id == first.charge_id) {
            ++named;
            BOOST_TEST(e.body.find("\"account\": \"" + acct_a + "\"") != std::string::npos, e.body);
        }
    BOOST_TEST(named >= 1);
}

BOOST_AUTO_TEST_SUITE_END()
