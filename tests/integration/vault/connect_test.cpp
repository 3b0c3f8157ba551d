// A vault key scoped to one Stripe Connect account, through the proxy: a request carrying exactly that
// Stripe-Account is reserved and forwarded with it (the charge lands in that account); another account, or
// none, is refused in Stripe's 403 invalid_request_error shape and never forwarded. A key without an account
// acts in the platform's own account only: a Stripe-Account through it is refused, never dropped (dropping it
// would charge the platform for a connected account's customer). g++ 12 -O2 false positive on Asio
// coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "fixture.hpp"
#include "stripe/json.hpp"

using namespace cg;
using cg::test::issued;
using cg::test::vault_fixture;

namespace {

const std::string acct_a = "acct_1VaultA", acct_b = "acct_1VaultB";

issued issue_connect_key(vault_fixture& f, const std::string& account) {
    auto s = vault::issue_secret();
    BOOST_TEST_REQUIRE(s.has_value());
    vault::new_key k;
    k.id = s->id;
    k.name = "connect key";
    k.secret_hash = s->hash;
    k.billing_period = "2026-11";
    k.cap_cents = 100'000;
    k.currency = "usd";
    k.allowed = *vault::parse_allow_list(vault::default_allow);
    k.stripe_account = account;
    auto r = f.run(f.store->insert_key(k));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    return {s->id, s->secret};
}

http::request with_stripe_account(http::request q, const std::string& account) {
    q.headers.add("Stripe-Account", account);
    return q;
}

std::string connect_refusal_of(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return e ? e->type + "/" + e->code : "(no error object)";
}

std::size_t charges_in_account(vault_fixture& f, const std::string& account) {
    std::size_t n = 0;
    for (const auto& c : f.fake->charges()) n += c.account == account;
    return n;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vault_connect)

BOOST_AUTO_TEST_CASE(a_key_scoped_to_one_account_acts_there_only) {
    vault_fixture f;
    f.fake->add_account(acct_a, {"cus_vault"});
    f.fake->add_account(acct_b, {"cus_vault"});
    auto k = issue_connect_key(f, acct_a);

    auto ok =
        f.send(with_stripe_account(f.post(k.secret, "/v1/charges", f.charge_body(700), "in-a"), acct_a));
    BOOST_TEST(ok.status == 200, ok.body);
    BOOST_TEST(charges_in_account(f, acct_a) == 1u);
    auto read = f.send(with_stripe_account(f.get(k.secret, "/v1/charges?customer=cus_vault"), acct_a));
    BOOST_TEST(read.status == 200, read.body);
    BOOST_TEST(read.body.find("\"ch_") != std::string::npos, read.body);  // A's charge, listed in A

    const auto before = f.fake_requests();
    std::vector<http::request> refused{
        with_stripe_account(f.post(k.secret, "/v1/charges", f.charge_body(700), "in-b"), acct_b),
        f.post(k.secret, "/v1/charges", f.charge_body(700), "on-platform"),
        with_stripe_account(f.get(k.secret, "/v1/charges?customer=cus_vault"), acct_b),
        f.get(k.secret, "/v1/charges?customer=cus_vault"),
        with_stripe_account(f.post(k.secret, "/v1/charges", f.charge_body(700), "empty"), ""),
    };
    for (auto& q : refused) {
        auto r = f.send(q);
        BOOST_TEST(r.status == 403, q.method << " " << q.target);
        BOOST_TEST(connect_refusal_of(r) == "invalid_request_error/account_invalid", r.body);
    }
    BOOST_TEST(f.fake_requests() == before);  // nothing refused reached Stripe
    BOOST_TEST(charges_in_account(f, acct_b) == 0u);
    BOOST_TEST(charges_in_account(f, "") == 0u);
    // Only the forwarded create counts against the cap.
    auto usage = f.run(f.store->usage(k.id));
    BOOST_TEST_REQUIRE(usage.has_value());
    BOOST_TEST_REQUIRE(usage->size() == 1u);
    BOOST_TEST(usage->at(0).committed() == 700);
    BOOST_TEST(usage->at(0).key.stripe_account == acct_a);
}

BOOST_AUTO_TEST_CASE(a_platform_key_refuses_any_stripe_account) {
    vault_fixture f;
    f.fake->add_account(acct_a, {"cus_vault"});
    auto k = issue_connect_key(f, "");
    const auto before = f.fake_requests();
    auto r =
        f.send(with_stripe_account(f.post(k.secret, "/v1/charges", f.charge_body(500), "connect"), acct_a));
    BOOST_TEST(r.status == 403, r.body);
    BOOST_TEST(connect_refusal_of(r) == "invalid_request_error/account_invalid", r.body);
    BOOST_TEST(f.fake_requests() == before);
    BOOST_TEST(f.fake->charges().empty());
    auto ok = f.send(f.post(k.secret, "/v1/charges", f.charge_body(500), "platform"));
    BOOST_TEST(ok.status == 200, ok.body);
    BOOST_TEST(charges_in_account(f, "") == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
