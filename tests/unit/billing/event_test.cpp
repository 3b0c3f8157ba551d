#include "billing/machine/event.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::billing;

namespace {
const char* good =
    R"({"customer_id":"acme-42","billing_period":"2026-11","amount_cents":1999,"currency":"USD",)"
    R"("stripe_customer_id":"cus_ABC123","description":"November","extra":{"ignored":[1,2]}})";
}

BOOST_AUTO_TEST_CASE(parses_a_valid_event) {
    auto e = parse_event(good);
    BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? "" : e.err().describe()));
    BOOST_TEST(e->customer_id == "acme-42");
    BOOST_TEST(e->billing_period == "2026-11");
    BOOST_TEST(e->amount_cents == 1999);
    BOOST_TEST(e->currency == "usd");
    BOOST_TEST(e->stripe_customer_id == "cus_ABC123");
    BOOST_TEST(e->description == "November");
}

BOOST_AUTO_TEST_CASE(rejects_bad_events_with_a_reason) {
    struct row {
        std::string body;
        event_errc code;
        std::string reason;
    };
    const std::string base =
        R"("customer_id":"c1","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1")";
    std::vector<row> rows{
        {"", event_errc::not_json, ""},
        {"not json", event_errc::not_json, ""},
        {"[1,2]", event_errc::not_json, ""},
        {"{" + base + R"(,"amount_cents":100} trailing)", event_errc::not_json, "expected one JSON object"},
        {"{" + base + "}", event_errc::missing_field, "amount_cents"},
        {"{" + base + R"(,"amount_cents":19.99})", event_errc::bad_field, "amount_cents"},
        {"{" + base + R"(,"amount_cents":"1999"})", event_errc::bad_field, "amount_cents"},
        {"{" + base + R"(,"amount_cents":0})", event_errc::bad_field, "amount_cents"},
        {"{" + base + R"(,"amount_cents":-5})", event_errc::bad_field, "amount_cents"},
        {"{" + base + R"(,"amount_cents":100000000})", event_errc::bad_field, "amount_cents"},
        {R"({"customer_id":"a:b","billing_period":"p","amount_cents":1,"currency":"usd","stripe_customer_id":"cus_1"})",
         event_errc::bad_field, "customer_id"},
        {R"({"customer_id":"a","billing_period":"p","amount_cents":1,"currency":"usdd","stripe_customer_id":"cus_1"})",
         event_errc::bad_field, "currency"},
        {R"({"customer_id":"a","billing_period":"p","amount_cents":1,"currency":"usd","stripe_customer_id":"acct_1"})",
         event_errc::bad_field, "stripe_customer_id"},
        {R"({"customer_id":7,"billing_period":"p","amount_cents":1,"currency":"usd","stripe_customer_id":"cus_1"})",
         event_errc::bad_field, "customer_id"},
        {std::string(max_event_bytes + 1, ' '), event_errc::too_large, ""},
    };
    for (const auto& r : rows) {
        auto e = parse_event(r.body);
        BOOST_TEST_CONTEXT(r.body.substr(0, 80)) {
            BOOST_REQUIRE(!e.has_value());
            BOOST_TEST((e.code() == r.code));
            BOOST_TEST(e.err().describe().find(r.reason) != std::string::npos);
        }
    }
}

// PaymentIntents per event: payment_method selects the PaymentIntent path; off_session defaults to true.
BOOST_AUTO_TEST_CASE(payment_method_and_off_session) {
    const std::string base =
        R"("customer_id":"c1","billing_period":"2026-11","amount_cents":100,"currency":"usd",)"
        R"("stripe_customer_id":"cus_1")";
    auto plain = parse_event("{" + base + "}");
    BOOST_REQUIRE(plain.has_value());
    BOOST_TEST(!plain->uses_payment_intent());

    auto pi = parse_event("{" + base + R"(,"payment_method":"pm_card_visa"})");
    BOOST_REQUIRE_MESSAGE(pi.has_value(), (pi ? "" : pi.err().describe()));
    BOOST_TEST(pi->uses_payment_intent());
    BOOST_TEST(pi->payment_method == "pm_card_visa");
    BOOST_TEST(pi->off_session);  // default: a billing run has no customer at hand

    auto on = parse_event("{" + base + R"(,"payment_method":"card_1ABC","off_session":false})");
    BOOST_REQUIRE(on.has_value());
    BOOST_TEST(!on->off_session);
    auto explicit_true = parse_event("{" + base + R"(,"off_session":true,"payment_method":"src_9"})");
    BOOST_REQUIRE(explicit_true.has_value());
    BOOST_TEST(explicit_true->off_session);

    struct row {
        std::string extra;
        std::string reason;
    };
    std::vector<row> bad{
        {R"("payment_method":"tok_visa")", "payment_method"},
        {R"("payment_method":"pm_a b")", "payment_method"},
        {R"("payment_method":"pm_)" + std::string(300, 'x') + "\"", "payment_method"},
        {R"("payment_method":42)", "payment_method"},
        {R"("payment_method":"pm_1","off_session":"yes")", "off_session"},
        {R"("off_session":true)", "off_session: only with payment_method"},
    };
    for (const auto& r : bad) {
        auto e = parse_event("{" + base + "," + r.extra + "}");
        BOOST_TEST_CONTEXT(r.extra) {
            BOOST_REQUIRE(!e.has_value());
            BOOST_TEST((e.code() == event_errc::bad_field));
            BOOST_TEST(e.err().message.find(r.reason) != std::string::npos, e.err().message);
        }
    }
}

// The sweeper's stand-in body: to_json gives back the same event, escapes included, with and without a
// payment method (off_session only with one, as parse_event demands).
BOOST_AUTO_TEST_CASE(to_json_round_trips) {
    billing_event plain{"acme-42", "2026-11", 1999, "usd", "cus_ABC", "plan \"gold\"\n\\ ok"};
    billing_event intent{"acme-43", "2026-11", 500, "eur", "cus_DEF", "", "pm_card_visa", false};
    for (const auto& e : {plain, intent}) {
        auto back = parse_event(to_json(e));
        BOOST_REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.err().describe()) + ": " + to_json(e));
        BOOST_TEST(back->customer_id == e.customer_id);
        BOOST_TEST(back->billing_period == e.billing_period);
        BOOST_TEST(back->amount_cents == e.amount_cents);
        BOOST_TEST(back->currency == e.currency);
        BOOST_TEST(back->stripe_customer_id == e.stripe_customer_id);
        BOOST_TEST(back->description == e.description);
        BOOST_TEST(back->payment_method == e.payment_method);
        BOOST_TEST(back->off_session == e.off_session);
    }
}
