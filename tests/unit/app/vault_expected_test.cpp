#include "app/vault_expected.hpp"

#include <boost/test/unit_test.hpp>
#include <sstream>

using namespace cg::app;

namespace {
std::string ev(const std::string& customer, const std::string& period, const std::string& amount,
               const std::string& currency = "usd") {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           amount + R"(,"currency":")" + currency + R"(","stripe_customer_id":"cus_1"})";
}
}  // namespace

BOOST_AUTO_TEST_SUITE(expected_file)

BOOST_AUTO_TEST_CASE(sums_each_customer_of_the_period_once_and_says_what_it_skipped) {
    std::stringstream in;
    in << ev("a", "2026-11", "1000") << "\n"
       << ev("a", "2026-11", "1000") << "\n"    // exact duplicate: the ledger charges once
       << ev("a", "2026-11", "1500") << "\n"    // same customer, other amount: dead-lettered as a conflict
       << ev("b", "2026-11", "2500") << "\r\n"  // CRLF
       << "\n   \n"                             // blank lines are not lines
       << ev("c", "2026-10", "700") << "\n"     // other period
       << ev("d", "2026-11", "300", "eur") << "\n"  // other currency
       << ev("e", "2026-11", "19.99") << "\n"       // invalid amount
       << R"({"hello":"world"})"
       << "\n"
       << "not json\n";
    auto t = sum_expected(in, "2026-11", "usd");
    BOOST_TEST(t.total_cents == 3500);
    BOOST_TEST(t.counted == 2u);
    BOOST_TEST(t.lines == 9u);
    BOOST_TEST(t.skipped_total() == 7u);
    BOOST_TEST(t.skipped["duplicate of an earlier line"] == 1u);
    BOOST_TEST(t.skipped["conflicting duplicate (other amount)"] == 1u);
    BOOST_TEST(t.skipped["other period 2026-10"] == 1u);
    BOOST_TEST(t.skipped["currency eur, not usd"] == 1u);
    std::size_t invalid = 0;
    for (const auto& [why, n] : t.skipped)
        if (why.starts_with("invalid (")) invalid += n;
    BOOST_TEST(invalid == 3u);
}

// A vault key acts in one Stripe account: the platform's own, or one connected account. Its expected total
// counts that account's events only — the same customer elsewhere is another account's charge.
BOOST_AUTO_TEST_CASE(counts_only_the_keys_own_stripe_account) {
    auto in_account = [](const std::string& customer, const std::string& amount, const std::string& account) {
        auto e = ev(customer, "2026-11", amount);
        return e.substr(0, e.size() - 1) + R"(,"stripe_account":")" + account + R"("})";
    };
    std::string run = ev("a", "2026-11", "1000") + "\n" + in_account("a", "2000", "acct_A") + "\n" +
                      in_account("b", "3000", "acct_A") + "\n" + in_account("a", "4000", "acct_B") + "\n";
    auto platform = sum_expected(run, "2026-11", "usd", std::string());
    BOOST_TEST(platform.total_cents == 1000);
    BOOST_TEST(platform.skipped["other Stripe account acct_A"] == 2u);
    BOOST_TEST(platform.skipped["other Stripe account acct_B"] == 1u);
    auto a = sum_expected(run, "2026-11", "usd", std::string("acct_A"));
    BOOST_TEST(a.total_cents == 5000);
    BOOST_TEST(a.counted == 2u);
    BOOST_TEST(a.skipped["other Stripe account (the platform's own)"] == 1u);
    BOOST_TEST(sum_expected(run, "2026-11", "usd").total_cents == 10000);  // no account: every one
}

BOOST_AUTO_TEST_SUITE_END()
