// Stripe Connect in the event and the key: an optional stripe_account that keeps a platform event's key byte
// for byte and separates two accounts' charges of one customer id and period.
#include <boost/test/unit_test.hpp>

#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/outcome.hpp"

using namespace cg::billing;

namespace {
const std::string connect_base =
    R"({"customer_id":"acme-42","billing_period":"2026-11","amount_cents":1999,"currency":"usd",)"
    R"("stripe_customer_id":"cus_ABC")";
}

BOOST_AUTO_TEST_CASE(stripe_account_is_parsed_and_validated) {
    auto platform = parse_event(connect_base + "}");
    BOOST_REQUIRE(platform.has_value());
    BOOST_TEST(!platform->connected());

    auto e = parse_event(connect_base + R"(,"stripe_account":"acct_1Plat9"})");
    BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? "" : e.err().describe()));
    BOOST_TEST(e->connected());
    BOOST_TEST(e->stripe_account == "acct_1Plat9");

    // A bad value is a field error (dead-lettered like any other), never read as the platform.
    for (const char* bad : {R"("")", R"("acct_")", R"("cus_1")", R"("acct_a-b")", R"("acct_a:b")",
                            R"(" acct_1")", R"(null)", R"(42)"}) {
        auto r = parse_event(connect_base + R"(,"stripe_account":)" + bad + "}");
        BOOST_REQUIRE_MESSAGE(!r.has_value(), bad);
        BOOST_TEST((r.code() == event_errc::bad_field));
        BOOST_TEST(r.err().message.find("stripe_account") != std::string::npos, r.err().message);
    }
    BOOST_TEST(!parse_event(connect_base + R"(,"stripe_account":"acct_)" + std::string(251, 'a') + "\"}")
                    .has_value());
    BOOST_TEST(parse_event(connect_base + R"(,"stripe_account":"acct_)" + std::string(250, 'a') + "\"}")
                   .has_value());
}

BOOST_AUTO_TEST_CASE(stripe_account_round_trips_through_to_json) {
    billing_event e{"acme-42", "2026-11", 1999, "usd", "cus_ABC", "", "pm_card_visa", true};
    e.stripe_account = "acct_2Other";
    auto back = parse_event(to_json(e));
    BOOST_REQUIRE_MESSAGE(back.has_value(), to_json(e));
    BOOST_TEST(back->stripe_account == "acct_2Other");
    BOOST_TEST(back->payment_method == "pm_card_visa");
    e.stripe_account.clear();
    BOOST_TEST(to_json(e).find("stripe_account") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(platform_key_unchanged_account_key_separate) {
    // printf 'prod:acme-42:2026-11' | sha256sum | cut -c1-32: the key every platform row was written under.
    BOOST_TEST(base_key("prod", "acme-42", "2026-11") == "08cee8c08160e33e1a370b75efbf63e5");
    BOOST_TEST(base_key("prod", "acme-42", "2026-11", "") == "08cee8c08160e33e1a370b75efbf63e5");
    // printf 'prod:acme-42:2026-11:acct_1Plat' | sha256sum | cut -c1-32
    BOOST_TEST(base_key("prod", "acme-42", "2026-11", "acct_1Plat") == "64f842c582488c853d6692347a1bec56");
    BOOST_TEST(base_key("prod", "acme-42", "2026-11", "acct_2Other") == "bb310c12624ddae9ccc366824ef36ebe");
    BOOST_TEST(base_key("prod", "acme-42", "2026-11", "acct_1Plat") !=
               base_key("prod", "acme-42", "2026-11", "acct_2Other"));
}

BOOST_AUTO_TEST_CASE(requests_carry_the_account) {
    billing_event e{"acme-42", "2026-11", 1999, "usd", "cus_ABC", ""};
    e.stripe_account = "acct_1Plat";
    auto key = base_key("prod", e.customer_id, e.billing_period, e.stripe_account);
    BOOST_TEST(build_charge_request(e, key, 1).stripe_account == "acct_1Plat");
    e.payment_method = "pm_card_visa";
    BOOST_TEST(build_intent_request(e, key, 2).stripe_account == "acct_1Plat");
    e.stripe_account.clear();
    BOOST_TEST(build_intent_request(e, key, 1).stripe_account.empty());
}
