// Helpers for the Stripe Connect tests: two connected accounts that both reach one Stripe customer, the
// events and keys of a customer on an account, and the charges fake-stripe holds in an account.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "fixture.hpp"

namespace cg::test::connect_support {

using namespace std::chrono_literals;
using fixture = test::billing_fixture;

inline const std::string acct_a = "acct_1ShopA";
inline const std::string acct_b = "acct_1ShopB";

// The event of `customer` for 2026-11 (Stripe customer cus_ok), on `account` (empty: the platform).
inline std::string connect_event(const std::string& customer, const std::string& account,
                                 std::int64_t amount = 1500, const std::string& extra = {}) {
    std::string body = R"({"customer_id":")" + customer + R"(","billing_period":"2026-11","amount_cents":)" +
                       std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":"cus_ok")";
    if (!account.empty()) body += R"(,"stripe_account":")" + account + "\"";
    return body + extra + "}";
}

inline std::string connect_key(const std::string& customer, const std::string& account) {
    return billing::base_key(test::key_namespace, customer, "2026-11", account);
}

// Both connected accounts reach cus_ok (each has a customer of that id, as a platform that mirrors its
// customers into every account has).
inline void connect_accounts(fixture& f) {
    f.fake->add_account(acct_a, {"cus_ok"});
    f.fake->add_account(acct_b, {"cus_ok"});
}

inline std::vector<const fake::charge_rec*> charges_in(fixture& f, const std::string& account) {
    std::vector<const fake::charge_rec*> out;
    for (const auto& c : f.fake->charges())
        if (c.account == account) out.push_back(&c);
    return out;
}

// The dead worker of a Connect event: its pre-flight committed (row pending, first attempt recorded) and
// nothing more; the lease has run out.
inline billing::ledger_record abandoned_row(fixture& f, const std::string& body,
                                            const std::string& message_id) {
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    billing::new_record nr{
        billing::base_key(test::key_namespace, ev->customer_id, ev->billing_period, ev->stripe_account), *ev,
        message_id, 1, test::key_namespace};
    auto pf = f.run(f.ledger->preflight(std::move(nr), 0ms));
    BOOST_TEST_REQUIRE(pf.has_value(), (pf ? "" : pf.err().describe()));
    BOOST_TEST_REQUIRE(pf->inserted);
    return std::move(pf->record);
}

}  // namespace cg::test::connect_support
