#include <boost/test/unit_test.hpp>

#include "billing/event.hpp"

using namespace cg::billing;

namespace {
const char* good = R"({"customer_id":"acme-42","billing_period":"2026-11","amount_cents":1999,"currency":"USD",)"
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
    const std::string base = R"("customer_id":"c1","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1")";
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
