// Defence in depth, shown: consume's billing pipeline with its ledger deliberately bypassed — a test-only,
// unsafe per-delivery idempotency key (a fresh key namespace per delivery, and the ledger rows wiped before
// each one, as if the ledger had lost them) — charges every redelivery again. Straight to Stripe that is
// three charges per event; through the vault proxy the period's total stops at the cap.
#include <boost/test/unit_test.hpp>
#include <map>

#include "billing/flow/charge_flow.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

namespace {

std::string event_json(int customer, std::int64_t amount) {
    return R"({"customer_id":"acme-)" + std::to_string(customer) +
           R"(","billing_period":"2026-11","amount_cents":)" + std::to_string(amount) +
           R"(,"currency":"usd","stripe_customer_id":"cus_acme)" + std::to_string(customer) +
           R"(","description":"November"})";
}

// The unsafe harness (test code only, never in src/): every delivery gets its own key namespace, so its own
// idempotency key, and the ledger forgets every row before each delivery.
struct unsafe_consumer {
    vault_fixture& f;
    stripe::client& stripe;
    billing::ledger ledger;
    int delivery = 0;
    std::map<std::string, int> verdicts;

    unsafe_consumer(vault_fixture& fx, stripe::client& s) : f(fx), stripe(s), ledger(fx.pg) {}

    void deliver(const std::string& body, const std::string& message_id, int attempt) {
        f.scalar("WITH gone AS (DELETE FROM billing_records RETURNING 1) SELECT count(*) FROM gone");
        billing::charge_flow_config c;
        c.key_namespace = "unsafe-" + std::to_string(++delivery);
        c.lease = 30s;
        c.lease_renew_interval = 5s;
        billing::charge_flow p(c, ledger, stripe, logger());
        billing::delivery d;
        d.topic = "billing";
        d.channel = "chargeguard";
        d.message_id = message_id;
        d.attempts = attempt;
        d.body = body;
        auto v = run_async(f.io, [&]() { return p.handle(std::move(d)); });
        ++verdicts[std::string(billing::to_string(v.reason))];
    }

    // Every message delivered three times (NSQ redelivers after a lost FIN, a timeout, a requeue).
    void run(int customers, std::int64_t amount) {
        for (int attempt = 1; attempt <= 3; ++attempt)
            for (int i = 0; i < customers; ++i)
                deliver(event_json(i, amount), "msg" + std::to_string(i), attempt);
    }
};

std::unique_ptr<stripe::client> client_for(vault_fixture& f, std::string base, std::string key) {
    auto c = f.config();
    c.api_base = std::move(base);
    c.api_key = std::move(key);
    c.request_timeout = 5s;
    return f.client(c);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(defence_in_depth)

BOOST_AUTO_TEST_CASE(the_unsafe_harness_charges_every_redelivery_when_it_talks_to_stripe_directly) {
    vault_fixture f(false);
    auto direct = client_for(f, "https://127.0.0.1:" + std::to_string(f.port), real_key);
    unsafe_consumer c(f, *direct);
    c.run(4, 1000);
    BOOST_TEST(f.fake_charges() == 12u);  // 4 events × 3 deliveries: the harness really is unsafe
    BOOST_TEST(c.verdicts["charged"] == 12);
}

BOOST_AUTO_TEST_CASE(through_the_proxy_the_periods_total_stops_at_the_cap) {
    vault_fixture f;
    const int customers = 20;
    const std::int64_t amount = 1000;
    auto k = f.issue(customers * amount * 11 / 10);  // expected × 1.10 = 22000
    auto via_proxy = client_for(f, "http://127.0.0.1:" + std::to_string(f.proxy_port), k.secret);
    unsafe_consumer c(f, *via_proxy);
    c.run(customers, amount);
    // 60 deliveries, each under a fresh key: 22 fit under the cap, the other 38 are refused before Stripe.
    BOOST_TEST(f.fake_charges() == 22u);
    BOOST_TEST(c.verdicts["charged"] == 22);
    BOOST_TEST(c.verdicts["cap_blocked"] == 38);
    auto key = "'" + k.id + "'";
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled' AND "
                       "vault_key_id = " +
                       key) == 22000);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state <> 'settled'") == 0);
    auto charged_total = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::int64_t> {
        std::int64_t t = 0;
        for (const auto& ch : fk->charges()) t += ch.amount;
        co_return t;
    }(f.fake.get()));
    BOOST_TEST(charged_total == 22000);  // what Stripe actually charged: never past the cap
}

BOOST_AUTO_TEST_SUITE_END()
