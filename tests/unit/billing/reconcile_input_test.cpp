// reconcile's expected-run reader (parse_expected in billing/report/reconcile.hpp, the expected sum in
// billing/report/expected_run.hpp): JSONL and CSV, corrections read as the period's corrected total, an entry
// per customer, period and account, and bad input refused naming the line.
#include <boost/test/unit_test.hpp>
#include <map>
#include <string>

#include "billing/machine/event.hpp"
#include "billing/report/expected_run.hpp"
#include "billing/report/reconcile.hpp"
#include "reconcile_support.hpp"

using namespace cg::billing;

using cg::test::reconcile_support::event;

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
