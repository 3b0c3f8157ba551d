// reconcile's pure parts: the expected-run reader, the classification table and the Stripe request pacer.
#define BOOST_TEST_MODULE billing_reconcile
#include "billing/report/reconcile.hpp"

#include <boost/test/unit_test.hpp>
#include <map>

#include "billing/report/expected_run.hpp"

using namespace cg::billing;
using namespace std::chrono_literals;

namespace {

billing_event event(std::int64_t amount = 1999) {
    billing_event e;
    e.customer_id = "acme";
    e.billing_period = "2026-11";
    e.amount_cents = amount;
    e.currency = "usd";
    e.stripe_customer_id = "cus_1";
    return e;
}

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

BOOST_AUTO_TEST_CASE(reads_jsonl_keeping_lines_verbatim) {
    std::string a =
        R"({"customer_id":"a","billing_period":"2026-11","amount_cents":100,"currency":"usd","stripe_customer_id":"cus_a"})";
    std::string b =
        R"({"billing_period":"2026-11","customer_id":"b","amount_cents":200,"currency":"eur","stripe_customer_id":"cus_b","extra":1})";
    auto r = parse_expected(a + "\n\n" + b + "\r\n" + a + "\n");
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST_REQUIRE(r->size() == 2u);  // the exact repeat of `a` is dropped
    BOOST_TEST((*r)[0].body == a);
    BOOST_TEST((*r)[1].body == b);  // verbatim: a re-publish is byte for byte what the producer sent
    BOOST_TEST((*r)[1].line == 3u);
    BOOST_TEST((*r)[1].event.amount_cents == 200);
}

BOOST_AUTO_TEST_CASE(reads_csv_with_header_in_any_order_and_quotes) {
    auto r = parse_expected(
        "currency,customer_id,amount_cents,billing_period,stripe_customer_id,description\n"
        "usd,acme-1,1999,2026-11,cus_1,\"Plan, \"\"pro\"\"\"\n"
        "\n"
        "eur,acme-2,500,2026-11,cus_2,\n");
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().message));
    BOOST_TEST_REQUIRE(r->size() == 2u);
    BOOST_TEST((*r)[0].event.description == "Plan, \"pro\"");
    BOOST_TEST((*r)[1].event.currency == "eur");
    BOOST_TEST((*r)[1].line == 4u);
    // The body is the event as JSON, readable by the same parser consume uses.
    auto again = parse_event((*r)[0].body);
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->customer_id == "acme-1");
    BOOST_TEST(again->amount_cents == 1999);
}

// A PaymentIntent event keeps its payment method and off_session through CSV, so a re-publish is the same
// event (charged through /v1/payment_intents, not as a plain charge).
BOOST_AUTO_TEST_CASE(csv_keeps_payment_method_and_off_session) {
    auto r = parse_expected(
        "customer_id,billing_period,amount_cents,currency,stripe_customer_id,payment_method,off_session\n"
        "acme-1,2026-11,1999,usd,cus_1,pm_card_visa,false\n"
        "acme-2,2026-11,500,usd,cus_2,pm_card_visa,\n"
        "acme-3,2026-11,700,usd,cus_3,,\n");
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().message));
    BOOST_TEST_REQUIRE(r->size() == 3u);
    BOOST_TEST((*r)[0].event.payment_method == "pm_card_visa");
    BOOST_TEST(!(*r)[0].event.off_session);
    BOOST_TEST((*r)[1].event.uses_payment_intent());
    BOOST_TEST((*r)[1].event.off_session);  // the default
    BOOST_TEST(!(*r)[2].event.uses_payment_intent());
    auto again = parse_event((*r)[0].body);
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->payment_method == "pm_card_visa");
    BOOST_TEST(!again->off_session);
    auto bad = parse_expected(
        "customer_id,billing_period,amount_cents,currency,stripe_customer_id,payment_method,off_session\n"
        "acme-1,2026-11,1999,usd,cus_1,pm_card_visa,maybe\n");
    BOOST_TEST_REQUIRE(!bad.has_value());
    BOOST_TEST(bad.err().message.find("off_session") != std::string::npos, bad.err().message);
}

BOOST_AUTO_TEST_CASE(refuses_bad_input_naming_the_line) {
    auto bad_amount = parse_expected(
        "customer_id,billing_period,amount_cents,currency,stripe_customer_id\nacme,2026-11,12.5,usd,cus_1\n");
    BOOST_TEST_REQUIRE(!bad_amount.has_value());
    BOOST_TEST(bad_amount.err().message.rfind("line 2: amount_cents", 0) == 0u, bad_amount.err().message);
    auto no_col = parse_expected("customer_id,billing_period,amount_cents,currency\nacme,2026-11,1,usd\n");
    BOOST_TEST_REQUIRE(!no_col.has_value());
    BOOST_TEST(no_col.err().message == "line 1: CSV header has no column stripe_customer_id");
    auto json = parse_expected("{\"customer_id\":\"a\"}\n");
    BOOST_TEST_REQUIRE(!json.has_value());
    BOOST_TEST(json.err().message.rfind("line 1: ", 0) == 0u);
    std::string a =
        R"({"customer_id":"a","billing_period":"p","amount_cents":100,"currency":"usd","stripe_customer_id":"cus_a"})";
    std::string a2 =
        R"({"customer_id":"a","billing_period":"p","amount_cents":101,"currency":"usd","stripe_customer_id":"cus_a"})";
    auto dup = parse_expected(a + "\n" + a2 + "\n");
    BOOST_TEST_REQUIRE(!dup.has_value());
    BOOST_TEST(dup.err().message.find("line 2: customer a period p is listed on line 1") == 0u,
               dup.err().message);
    auto empty = parse_expected("\n \n");
    BOOST_TEST_REQUIRE(empty.has_value());
    BOOST_TEST(empty->empty());
}

BOOST_AUTO_TEST_CASE(event_json_round_trips) {
    auto e = event();
    e.description = "a \"quoted\" plan\n";
    auto back = parse_event(event_json(e));
    BOOST_TEST_REQUIRE(back.has_value());
    BOOST_TEST(back->description == e.description);
    BOOST_TEST(back->stripe_customer_id == "cus_1");
    BOOST_TEST(back->amount_cents == 1999);
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

// A run with corrections: the original line is the expected event, the highest revision its corrected total;
// the same revision twice with another total is refused, a repeat is not.
BOOST_AUTO_TEST_CASE(reads_corrections_as_the_periods_corrected_total) {
    const std::string head =
        R"({"customer_id":"acme","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1",)";
    auto run = head + R"("amount_cents":1000})" + "\n" + head + R"("amount_cents":700,"revision":2})" + "\n" +
               head + R"("amount_cents":1500,"revision":1})" + "\n" + head +
               R"("amount_cents":1500,"revision":1})";
    auto r = parse_expected(run);
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST_REQUIRE(r->size() == 1u);
    BOOST_TEST((*r)[0].event.amount_cents == 1000);
    BOOST_TEST(!(*r)[0].event.is_correction());
    BOOST_TEST((*r)[0].corrected_total.value_or(-1) == 700);
    BOOST_TEST((*r)[0].corrected_revision == 2);
    auto bad = parse_expected(head + R"("amount_cents":1000})" + "\n" + head +
                              R"("amount_cents":700,"revision":1})" + "\n" + head +
                              R"("amount_cents":800,"revision":1})");
    BOOST_TEST(!bad.has_value());
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

// Stripe Connect: an entry of the run is a (customer, period, stripe_account). The same customer and period
// on the platform and on two accounts are three entries, in JSONL and in CSV (an optional stripe_account
// column, empty for the platform), each with its own corrections; a conflicting repeat within one account is
// refused naming the account. The expected sum counts each entry once, and each one's corrections against its
// own original.
BOOST_AUTO_TEST_CASE(an_entry_is_a_customer_period_and_account) {
    const std::string head =
        R"({"customer_id":"acme","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1",)";
    auto jsonl = head + R"("amount_cents":1000})" + "\n" + head +
                 R"("amount_cents":2000,"stripe_account":"acct_A"})" + "\n" + head +
                 R"("amount_cents":3000,"stripe_account":"acct_B"})" + "\n" + head +
                 R"("amount_cents":2500,"stripe_account":"acct_A","revision":1})" + "\n";
    auto r = parse_expected(jsonl);
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST_REQUIRE(r->size() == 3u);
    std::map<std::string, const expected_event*> by_account;
    for (const auto& e : *r) by_account[e.event.stripe_account] = &e;
    BOOST_TEST_REQUIRE(by_account.size() == 3u);
    BOOST_TEST(by_account[""]->event.amount_cents == 1000);
    BOOST_TEST(!by_account[""]->corrected_total.has_value());  // acct_A's correction is not the platform's
    BOOST_TEST(by_account["acct_A"]->corrected_total.value_or(-1) == 2500);
    BOOST_TEST(by_account["acct_B"]->event.amount_cents == 3000);
    BOOST_TEST(!by_account["acct_B"]->corrected_total.has_value());
    auto sum = sum_expected(jsonl, "2026-11", "usd");
    BOOST_TEST(sum.total_cents == 1000 + 2500 + 3000);
    BOOST_TEST(sum.skipped_total() == 0u);

    auto csv = parse_expected(
        "customer_id,billing_period,amount_cents,currency,stripe_customer_id,stripe_account\n"
        "acme,2026-11,1000,usd,cus_1,\n"
        "acme,2026-11,2000,usd,cus_1,acct_A\n");
    BOOST_TEST_REQUIRE(csv.has_value(), (csv ? "" : csv.err().describe()));
    BOOST_TEST_REQUIRE(csv->size() == 2u);
    BOOST_TEST((*csv)[0].event.stripe_account == "");
    BOOST_TEST((*csv)[1].event.stripe_account == "acct_A");
    auto again = parse_event((*csv)[1].body);  // the body re-published for it keeps the account
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->stripe_account == "acct_A");
    auto back = parse_event(event_json(again.value()));
    BOOST_TEST_REQUIRE(back.has_value());
    BOOST_TEST(back->stripe_account == "acct_A");

    auto bad_account = parse_expected(
        "customer_id,billing_period,amount_cents,currency,stripe_customer_id,stripe_account\n"
        "acme,2026-11,1000,usd,cus_1,shop\n");
    BOOST_TEST_REQUIRE(!bad_account.has_value());
    BOOST_TEST(bad_account.err().message.find("stripe_account") != std::string::npos,
               bad_account.err().message);
    auto conflict = parse_expected(head + R"("amount_cents":2000,"stripe_account":"acct_A"})" + "\n" + head +
                                   R"("amount_cents":2001,"stripe_account":"acct_A"})" + "\n");
    BOOST_TEST_REQUIRE(!conflict.has_value());
    BOOST_TEST(conflict.err().message.find("line 2: customer acme period 2026-11 account acct_A is listed on "
                                           "line 1") == 0u,
               conflict.err().message);
}
