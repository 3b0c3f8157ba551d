// reconcile's pure parts: the classification table and the Stripe request pacer (the expected-run reader:
// reconcile_input_test.cpp).
#define BOOST_TEST_MODULE billing_reconcile
#include "billing/report/reconcile.hpp"

#include <boost/test/unit_test.hpp>

#include "billing/report/expected_run.hpp"
#include "reconcile_support.hpp"

using namespace cg::billing;
using namespace std::chrono_literals;

namespace {

using cg::test::reconcile_support::event;

ledger_record record(record_status s, std::optional<std::string> charge = std::nullopt) {
    ledger_record r;
    r.key = "k";
    r.customer_id = "acme";
    r.billing_period = "2026-11";
    r.amount_cents = 1999;
    r.currency = "usd";
    r.stripe_customer_id = "cus_1";
    r.status = s;
    r.charge_id = std::move(charge);
    return r;
}

charge_fact charge(std::string id, std::string status = "succeeded", std::int64_t amount = 1999,
                   std::string customer = "cus_1") {
    return {std::move(id), amount, "usd", std::move(customer), std::move(status), "k"};
}

recon_facts facts() {
    recon_facts f;
    f.key = "k";
    f.expected = expected_event{event(), event_json(event()), 1, std::nullopt, 0};
    return f;
}

// charged row + its charge found at Stripe
recon_facts charged_ok() {
    auto f = facts();
    f.record = record(record_status::charged, "ch_1");
    f.charges = {charge("ch_1")};
    f.recorded_charge_known = true;
    f.recorded_charge = charge("ch_1");
    return f;
}

}  // namespace

BOOST_AUTO_TEST_CASE(classification_table) {
    struct row {
        const char* name;
        recon_facts f;
        recon_class want;
    };
    std::vector<row> table;
    table.push_back({"charged and Stripe agrees", charged_ok(), recon_class::ok});
    {
        auto f = facts();
        table.push_back({"expected, nothing else: lost message", f, recon_class::missing});
    }
    {
        auto f = facts();
        f.dead_letter_reason = "dead letter 3: conflict";
        table.push_back({"no row, a dead letter", f, recon_class::dead_lettered});
    }
    {
        auto f = facts();
        f.charges = {charge("ch_9")};
        table.push_back({"no row, a charge with the key", f, recon_class::not_in_ledger});
    }
    {
        auto f = facts();
        f.charges = {charge("ch_9")};
        f.dead_letter_reason = "dead letter 3";
        table.push_back({"a charge outranks a dead letter", f, recon_class::not_in_ledger});
    }
    {
        auto f = charged_ok();
        f.charges.push_back(charge("ch_2"));
        table.push_back({"second successful charge for one key", f, recon_class::not_in_ledger});
    }
    {
        auto f = charged_ok();
        f.charges.push_back(charge("ch_2", "failed"));
        table.push_back({"an earlier failed charge is no second charge", f, recon_class::ok});
    }
    {
        auto f = charged_ok();
        f.charges.clear();
        f.recorded_charge.reset();
        table.push_back({"recorded charge does not exist", f, recon_class::absent_at_stripe});
    }
    {
        auto f = charged_ok();
        f.record->charge_id = "ch_gone";
        f.recorded_charge.reset();
        table.push_back(
            {"recorded charge gone, the real one carries the key", f, recon_class::absent_at_stripe});
    }
    {
        auto f = charged_ok();
        f.recorded_charge = charge("ch_1", "succeeded", 1999, "cus_other");
        table.push_back({"recorded charge is another customer's", f, recon_class::absent_at_stripe});
    }
    {
        auto f = charged_ok();
        f.recorded_charge = charge("ch_1", "succeeded", 5);
        table.push_back({"recorded charge has another amount", f, recon_class::absent_at_stripe});
    }
    {
        auto f = charged_ok();
        f.recorded_charge = charge("ch_1", "failed");
        table.push_back({"recorded charge failed", f, recon_class::absent_at_stripe});
    }
    {
        auto f = charged_ok();
        f.recorded_charge_known = false;
        f.recorded_charge.reset();
        table.push_back({"recorded charge not looked up: no verdict against it", f, recon_class::ok});
    }
    {
        auto f = charged_ok();
        f.expected->event.amount_cents = 2500;
        table.push_back({"expected amount differs", f, recon_class::mismatch});
    }
    {
        auto f = charged_ok();
        f.expected->event.currency = "eur";
        table.push_back({"expected currency differs", f, recon_class::mismatch});
    }
    {
        auto f = charged_ok();
        f.expected.reset();
        table.push_back({"ledger row the expected list lacks", f, recon_class::mismatch});
    }
    {
        auto f = facts();
        f.record = record(record_status::pending);
        table.push_back({"pending, nothing at Stripe", f, recon_class::pending});
    }
    {
        auto f = facts();
        f.record = record(record_status::pending);
        f.charges = {charge("ch_5")};
        table.push_back(
            {"pending with a charge: recovery settles it, not a foreign charge", f, recon_class::pending});
    }
    {
        auto f = facts();
        f.record = record(record_status::declined, "ch_d");
        f.charges = {charge("ch_d", "failed")};
        table.push_back({"declined", f, recon_class::declined});
    }
    for (auto s : {record_status::failed, record_status::conflict}) {
        auto f = facts();
        f.record = record(s);
        f.dead_letter_reason = "dead letter 1: stripe rejected";
        table.push_back({"failed/conflict row", f, recon_class::dead_lettered});
    }
    {
        auto f = facts();
        f.record = record(record_status::cap_blocked);
        table.push_back({"cap blocked", f, recon_class::cap_blocked});
    }
    for (const auto& r : table) {
        auto v = classify(r.f);
        BOOST_TEST_CONTEXT(r.name) {
            BOOST_TEST(to_string(v.cls) == to_string(r.want));
            BOOST_TEST(!v.detail.empty());
        }
    }
}

BOOST_AUTO_TEST_CASE(explained_classes) {
    BOOST_TEST(is_explained(recon_class::ok));
    BOOST_TEST(is_explained(recon_class::declined));
    BOOST_TEST(is_explained(recon_class::dead_lettered));
    BOOST_TEST(is_explained(recon_class::cap_blocked));
    BOOST_TEST(is_explained(recon_class::processing));
    for (auto c : {recon_class::missing, recon_class::pending, recon_class::absent_at_stripe,
                   recon_class::not_in_ledger, recon_class::mismatch})
        BOOST_TEST(!is_explained(c), to_string(c));
}

BOOST_AUTO_TEST_CASE(detail_names_the_facts) {
    auto f = charged_ok();
    f.expected->event.amount_cents = 2500;
    BOOST_TEST(classify(f).detail == "expected cus_1 2500 usd, ledger cus_1 1999 usd");
    auto g = charged_ok();
    g.charges.push_back(charge("ch_2"));
    BOOST_TEST(classify(g).detail == "charge ch_2 (1999 usd) carries the key; the ledger records ch_1");
}

BOOST_AUTO_TEST_CASE(pacer_allows_a_burst_then_the_rate) {
    using clock = request_pacer::clock;
    request_pacer p(10.0, 3);
    auto t = clock::time_point(std::chrono::seconds(100));
    BOOST_TEST(p.delay(t).count() == 0);
    BOOST_TEST(p.delay(t).count() == 0);
    BOOST_TEST(p.delay(t).count() == 0);
    // Fourth at the same instant: 100 ms; fifth (booked behind it): 200 ms.
    auto d4 = std::chrono::duration_cast<std::chrono::milliseconds>(p.delay(t));
    auto d5 = std::chrono::duration_cast<std::chrono::milliseconds>(p.delay(t));
    BOOST_TEST(d4.count() == 100);
    BOOST_TEST(d5.count() == 200);
    // A caller that waited as told is let through at the rate: 100 ms apart from then on.
    auto d6 = std::chrono::duration_cast<std::chrono::milliseconds>(p.delay(t + 200ms));
    BOOST_TEST(d6.count() == 100);
    // After a long pause the burst is back, no more.
    auto later = t + 10s;
    for (int i = 0; i < 3; ++i) BOOST_TEST(p.delay(later).count() == 0);
    BOOST_TEST(p.delay(later).count() > 0);
    // Over any window, requests let through ≤ burst + rate × window.
    request_pacer q(5.0, 5);
    auto start = clock::time_point(std::chrono::seconds(500));
    auto now = start;
    int sent = 0;
    while (now - start < 2s) {
        now += q.delay(now);
        if (now - start < 2s) ++sent;
    }
    BOOST_TEST(sent <= 5 + 10);
    BOOST_TEST(sent >= 14);
}

// Reconcile compares the money moved for a corrected period with the corrected total: equal is ok; a
// revision under way is pending; otherwise a mismatch naming both. Without corrections nothing changes.
BOOST_AUTO_TEST_CASE(corrected_totals_are_compared_with_the_money_moved) {
    auto f = charged_ok();
    f.expected->corrected_total = 700;
    f.expected->corrected_revision = 2;
    f.corrected_net = 700;
    BOOST_TEST(to_string(classify(f).cls) == "ok");
    f.corrected_net = 1500;
    auto v = classify(f);
    BOOST_TEST(to_string(v.cls) == "amount_currency_mismatch");
    BOOST_TEST(v.detail.find("700") != std::string::npos, v.detail);
    f.correction_open = true;
    BOOST_TEST(to_string(classify(f).cls) == "pending");
    // The run lists no correction, the ledger applied one: the money moved differs from the run.
    auto g = charged_ok();
    g.corrected_net = 500;
    BOOST_TEST(to_string(classify(g).cls) == "amount_currency_mismatch");
    BOOST_TEST(to_string(classify(charged_ok()).cls) == "ok");
}
