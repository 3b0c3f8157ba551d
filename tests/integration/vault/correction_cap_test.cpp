// Corrections through the vault proxy (docs/design.md §4a, docs/operating/vault.md): a correction's charge
// counts against the period's key like any charge, so a correction past the cap is refused before Stripe; a
// refund is forwarded (on a key that allows refunds) and gives no room back unless the key's policy says so;
// a key that does not allow refunds keeps the refund pending, never moved and never dropped.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/flow/charge_flow.hpp"
#include "billing/store/ledger.hpp"
#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

namespace {

std::string body(std::int64_t amount, int revision) {
    std::string b = R"({"customer_id":"acme-1","billing_period":"2026-11","amount_cents":)" +
                    std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":"cus_acme1")";
    if (revision > 0) b += ",\"revision\":" + std::to_string(revision);
    return b + "}";
}

struct through_proxy {
    vault_fixture& f;
    std::unique_ptr<stripe::client> stripe;
    billing::ledger ledger;
    std::unique_ptr<billing::charge_flow> p;

    through_proxy(vault_fixture& fx, const std::string& secret) : f(fx), ledger(fx.pg) {
        auto c = f.config();
        c.api_base = "http://127.0.0.1:" + std::to_string(f.proxy_port);
        c.api_key = secret;
        c.request_timeout = 5s;
        stripe = f.client(c);
        billing::charge_flow_config pc;
        pc.key_namespace = "cap";
        pc.lease = 30s;
        pc.lease_renew_interval = 5s;
        pc.stripe_unavailable_delay = 104ms;
        p = std::make_unique<billing::charge_flow>(pc, ledger, *stripe, logger());
    }

    billing::verdict deliver(std::int64_t amount, int revision, int attempt = 1) {
        billing::delivery d;
        d.topic = "billing";
        d.channel = "chargeguard";
        d.message_id = "m" + std::to_string(revision);
        d.attempts = attempt;
        d.body = body(amount, revision);
        return run_async(f.io, [&]() { return p->handle(std::move(d)); });
    }
};

std::string why(const billing::verdict& v) {
    return std::string(billing::to_string(v.reason));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(corrections_and_the_cap)

// Cap 1500: the original (1000) and revision 1 (+400) fit; revision 2 (+600, to 2000) is refused by the proxy
// before Stripe (cap_blocked, dead letter, the revision failed); revision 3 (to 500) refunds 900 through the
// proxy in two refunds (revision 1's 400, then 500 of the original) — and the cap keeps its 1400 committed,
// since the key's policy does not reopen room for refunds.
BOOST_AUTO_TEST_CASE(a_correction_counts_against_the_cap_and_a_refund_returns_no_room_by_default) {
    vault_fixture f;
    auto k = f.issue(1500, std::string(vault::default_allow) + ",refunds.create,refunds.read");
    through_proxy c(f, k.secret);
    BOOST_TEST(why(c.deliver(1000, 0)) == "charged");
    BOOST_TEST(why(c.deliver(1400, 1)) == "charged");
    auto over = c.deliver(2000, 2);
    BOOST_TEST(why(over) == "cap_blocked", over.detail);
    BOOST_TEST(f.fake_charges() == 2u);
    BOOST_TEST(f.count("SELECT count(*) FROM billing_corrections WHERE revision = 2 AND status = 'failed'") ==
               1);
    BOOST_TEST(f.count("SELECT count(*) FROM dead_letters WHERE reason = 'spend cap exceeded'") == 1);

    auto down = c.deliver(500, 3);
    BOOST_TEST(why(down) == "refunded", down.detail);
    auto refunded = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::int64_t> {
        std::int64_t t = 0;
        for (const auto& r : fk->refunds()) t += r.amount;
        co_return t;
    }(f.fake.get()));
    BOOST_TEST(refunded == 900);
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 1400);
    f.flush_audit();
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_audit WHERE path = '/v1/refunds' AND outcome = 'refund'") == 2);
}

// A key issued without refunds: the proxy refuses the refund (403), which is our setup, not the event — the
// revision stays pending and is requeued, nothing moved, nothing dead-lettered.
BOOST_AUTO_TEST_CASE(a_key_without_refunds_keeps_the_refund_pending) {
    vault_fixture f;
    auto k = f.issue(5000);
    through_proxy c(f, k.secret);
    BOOST_TEST(why(c.deliver(1000, 0)) == "charged");
    auto v = c.deliver(600, 1);
    BOOST_TEST(why(v) == "requeued_stripe_unavailable", v.detail);
    BOOST_TEST(!v.finished());
    BOOST_TEST(f.count("SELECT count(*) FROM billing_corrections WHERE status = 'pending'") == 1);
    BOOST_TEST(f.count("SELECT count(*) FROM dead_letters") == 0);
    auto refunds = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::int64_t> {
        co_return static_cast<std::int64_t>(fk->refunds().size());
    }(f.fake.get()));
    BOOST_TEST(refunds == 0);
}

BOOST_AUTO_TEST_SUITE_END()
