// Leases of a key's cap (docs/design.md §5, "Cap leases"): two proxies share a key's cap by leases and
// reach it exactly, never past it; a proxy killed holding a lease leaves its cents counted until an
// operator forfeits them, and what it forwarded without writing a row stays inside them.
#include <boost/test/unit_test.hpp>

#include "stripe/json.hpp"
#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t amount = 100;

// Leases once a 50 ms window saw a create, sized to `size` of that pace (500 ms: ten windows): a test's few
// hundred creates take and top up several leases per proxy. One create per window, not more: the test's
// creates go one at a time, alternating between the proxies, so on a loaded machine a proxy may see only
// one per window, and a pace it never reached would leave it without a lease.
vault::proxy_config leasing(const vault_fixture& f, std::chrono::milliseconds size = 500ms) {
    auto c = f.proxy_config();
    c.cap_lease = size;
    c.lease_pace_window = 50ms;
    c.lease_min_creates = 1;
    return c;
}

std::int64_t charged_total(vault_fixture& f) {
    return f.run([](fake::fake_stripe* fk) -> net::awaitable<std::int64_t> {
        std::int64_t t = 0;
        for (const auto& ch : fk->charges()) t += ch.amount;
        co_return t;
    }(f.fake.get()));
}

bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

// The value of a metric's series as the registry renders it (`name{labels} value`), or -1 without one.
double sample(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
}

bool capped(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return r.status == 402 && e && e->code == "spend_cap_exceeded";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vault_cap_lease)

BOOST_AUTO_TEST_CASE(two_proxies_share_a_keys_cap_by_leases_and_reach_it_exactly) {
    vault_fixture f(false);
    f.start(leasing(f));
    auto& b = f.start_second(leasing(f));
    const std::int64_t cap = 300 * amount;
    auto k = f.issue(cap);
    const std::string key = "'" + k.id + "'";
    std::int64_t ok = 0, refused_in_a_row = 0, sent = 0;
    bool retried = false;
    std::int64_t leased_seen = 0;
    while (refused_in_a_row < 6 && sent < 2000) {
        auto q = f.post(k.secret, "/v1/charges", f.charge_body(amount), "share-" + std::to_string(sent));
        http::response r;
        if (sent % 2 == 0) {
            r = f.send(std::move(q));
        } else {
            auto got = f.run(b.request(std::move(q)));
            BOOST_TEST_REQUIRE(got.ok(), got.err.describe());
            r = std::move(got.resp);
        }
        ++sent;
        if (r.status == 200) {
            ++ok;
            refused_in_a_row = 0;
        } else {
            BOOST_TEST_REQUIRE(capped(r), r.status << " " << r.body);
            ++refused_in_a_row;
        }
        leased_seen = std::max(leased_seen, f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key));
        if (!retried &&
            f.count("SELECT count(DISTINCT holder) FROM vault_leases WHERE spent_cents > 0") == 2) {
            // Both proxies spend from leases now: a retry of a create proxy A forwarded, sent to proxy B, is
            // forwarded (Stripe replays it) and counted once.
            retried = true;
            auto again = f.run(b.request(f.post(k.secret, "/v1/charges", f.charge_body(amount), "share-0")));
            BOOST_TEST_REQUIRE(again.ok());
            BOOST_TEST(again.resp.status == 200);
            BOOST_TEST(again.resp.headers.get("Idempotent-Replayed").value_or("") == "true");
        }
    }
    BOOST_TEST(retried);
    BOOST_TEST(leased_seen > 0);
    // Exactly the cap, and never more, reached Stripe.
    BOOST_TEST(ok * amount == cap);
    BOOST_TEST(f.fake_charges() == static_cast<std::size_t>(ok));
    BOOST_TEST(charged_total(f) == cap);
    // Both proxies took leases and spent from them.
    BOOST_TEST(f.count("SELECT count(DISTINCT holder) FROM vault_leases WHERE vault_key_id = " + key) == 2);
    BOOST_TEST(f.count("SELECT sum(spent_cents) FROM vault_leases WHERE vault_key_id = " + key) > cap / 2);
    // One row per create, the retry counted once, all settled.
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE vault_key_id = " + key) == ok);
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled' AND "
                       "vault_key_id = " +
                       key) == cap);
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = " + key) == cap);
    // Stopped, both give back what their leases still hold: nothing is leased and every lease is closed.
    f.run(f.proxy->stop());
    f.run(f.second->proxy->stop());
    BOOST_TEST(f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key) == 0);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_leases WHERE closed_at IS NULL") == 0);
}

BOOST_AUTO_TEST_CASE(a_proxy_killed_holding_a_lease_strands_its_cents_and_the_cap_is_never_passed) {
    vault_fixture f(false);
    auto lost = f.pool_for(f.db.config(), 2);
    // Proxy A, whose PostgreSQL goes away below; small leases, as the cap is 200 creates.
    f.start(leasing(f, 100ms), lost);
    auto& b = f.start_second(leasing(f));
    const std::int64_t cap = 200 * amount;
    auto k = f.issue(cap);
    const std::string key = "'" + k.id + "'";
    // A spends until it holds a lease.
    int sent = 0;
    while (f.count("SELECT count(*) FROM vault_leases WHERE granted_cents > spent_cents") == 0 &&
           sent < 200) {
        BOOST_TEST_REQUIRE(
            f.send(f.post(k.secret, "/v1/charges", f.charge_body(amount), "a-" + std::to_string(sent)))
                .status == 200);
        ++sent;
    }
    BOOST_TEST_REQUIRE(sent < 200);
    // A loses PostgreSQL: it still forwards what its lease covers (no round trip before forwarding), and
    // cannot write those rows; past its lease it answers 503, forwarding nothing.
    f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<void> { co_await p->close(); }(lost));
    int unwritten = 0;
    for (;;) {
        auto r =
            f.send(f.post(k.secret, "/v1/charges", f.charge_body(amount), "a-" + std::to_string(sent++)));
        if (r.status != 200) {
            BOOST_TEST(r.status == 503);
            break;
        }
        ++unwritten;
    }
    BOOST_TEST(unwritten > 0);
    // A dies: nothing of it reaches PostgreSQL again (its stop gives up the writes; the lease stays open).
    f.server->stop();
    f.run(f.proxy->stop());
    const std::int64_t stranded = f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key);
    BOOST_TEST(stranded >= unwritten * amount);  // the unwritten creates are inside what stays counted
    BOOST_TEST(f.count("SELECT count(*) FROM vault_leases WHERE closed_at IS NULL") == 1);
    {
        auto text = f.vreg.render();
        BOOST_TEST(has(text, "chargeguard_vault_leases_stranded_total 1"), text);
        BOOST_TEST(has(text, "chargeguard_vault_lease_cents{key=\"" + k.id + "\"} 0"), text);
    }

    // B spends all the rest: refused once the rows and A's lease fill the cap.
    int refused_in_a_row = 0, n = 0;
    while (refused_in_a_row < 3 && n < 1000) {
        auto r = f.run(
            b.request(f.post(k.secret, "/v1/charges", f.charge_body(amount), "b-" + std::to_string(n++))));
        BOOST_TEST_REQUIRE(r.ok());
        if (r.resp.status == 200) {
            refused_in_a_row = 0;
        } else {
            BOOST_TEST_REQUIRE(capped(r.resp), r.resp.status << " " << r.resp.body);
            ++refused_in_a_row;
        }
    }
    BOOST_TEST(f.run(f.second->proxy->flush_settlements()));
    auto committed = f.count("SELECT committed_cents FROM vault_keys WHERE id = " + key);
    auto leased = f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key);
    BOOST_TEST(committed + leased <= cap);
    BOOST_TEST(cap - committed - leased < amount);
    // Never past the cap: Stripe charged the rows plus A's unwritten creates, which its lease still holds.
    BOOST_TEST(charged_total(f) == committed + unwritten * amount);
    BOOST_TEST(charged_total(f) <= cap);

    // The operator, having found A's unwritten creates on Stripe, forfeits its lease keeping them counted:
    // the rest comes back, and B reaches the cap exactly.
    auto lease = f.scalar("SELECT id FROM vault_leases WHERE closed_at IS NULL ORDER BY id LIMIT 1");  // A's
    BOOST_TEST(f.count("SELECT cg_vault_lease_forfeit(" + lease + ", " + std::to_string(unwritten * amount) +
                       ")") == stranded - unwritten * amount);
    BOOST_TEST(f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key) == leased - stranded);
    refused_in_a_row = 0;
    while (refused_in_a_row < 3 && n < 2000) {
        auto r = f.run(
            b.request(f.post(k.secret, "/v1/charges", f.charge_body(amount), "b-" + std::to_string(n++))));
        BOOST_TEST_REQUIRE(r.ok());
        refused_in_a_row = r.resp.status == 200 ? 0 : refused_in_a_row + 1;
    }
    f.run(f.second->proxy->stop());
    BOOST_TEST(f.count("SELECT leased_cents FROM vault_keys WHERE id = " + key) == 0);
    BOOST_TEST(charged_total(f) == cap);
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = " + key) == cap);
}

// The proxy's lease metrics follow its lease: what it may still spend (the lease's granted less spent cents
// in PostgreSQL once every spend is written), the statement that took it, and the cents it gave back at stop.
BOOST_AUTO_TEST_CASE(lease_metrics_show_what_the_proxy_holds_took_and_gave_back) {
    vault_fixture f(false);
    f.start(leasing(f));
    auto k = f.issue(1000 * amount);
    const std::string gauge = "chargeguard_vault_lease_cents{key=\"" + k.id + "\"}";
    BOOST_TEST(sample(f.vreg.render(), gauge) == -1);  // no series before a lease
    int sent = 0;
    while (f.count("SELECT count(*) FROM vault_leases WHERE spent_cents > 0") == 0 && sent < 300) {
        BOOST_TEST_REQUIRE(
            f.send(f.post(k.secret, "/v1/charges", f.charge_body(amount), "m-" + std::to_string(sent++)))
                .status == 200);
    }
    BOOST_TEST_REQUIRE(sent < 300);
    // No create now: once the spends are written (and a top-up in flight has landed), the gauge is what the
    // lease holds in PostgreSQL.
    std::int64_t held = -1;
    double shown = -2;
    for (int i = 0; i < 400 && shown != static_cast<double>(held); ++i) {
        BOOST_TEST_REQUIRE(f.run(f.proxy->flush_settlements()));
        held = f.count(
            "SELECT coalesce(sum(granted_cents - spent_cents), -1) FROM vault_leases WHERE "
            "closed_at IS NULL");
        shown = sample(f.vreg.render(), gauge);
        if (shown != static_cast<double>(held)) f.pause(5ms);
    }
    BOOST_TEST(held > 0);
    BOOST_TEST(shown == static_cast<double>(held));
    auto text = f.vreg.render();
    BOOST_TEST(sample(text, "chargeguard_vault_lease_takes_total{result=\"new\"}") == 1, text);
    BOOST_TEST(sample(text, "chargeguard_vault_lease_returned_cents_total") == 0, text);
    BOOST_TEST(sample(text, "chargeguard_vault_expired_lease_cents") == 0, text);
    // A dead proxy's lease (taken as a proxy takes one, 1 ms to live, never renewed): the ledger-wide gauge
    // shows what it holds once the gauges are refreshed past its expiry.
    const auto dead =
        f.count("SELECT granted FROM cg_vault_lease_take('" + k.id + "', NULL, 'dead:1:0f', 700, 1, 1)");
    BOOST_TEST_REQUIRE(dead > 0);
    double expired = -1;
    for (int i = 0; i < 400 && expired != static_cast<double>(dead); ++i) {
        f.pause(5ms);
        expired = sample(f.vreg.render(), "chargeguard_vault_expired_lease_cents");
    }
    BOOST_TEST(expired == static_cast<double>(dead));
    // Stopped, it gives the lease back: what it held, and the gauge falls to 0.
    f.run(f.proxy->stop());
    const auto closed = f.count("SELECT count(*) FROM vault_leases WHERE closed_by = 'holder'");
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_leases WHERE closed_at IS NULL AND holder = 'dead:1:0f'") == 1);
    BOOST_TEST(closed == 1);
    text = f.vreg.render();
    BOOST_TEST(sample(text, gauge) == 0, text);
    // Everything unspent went back (the lease row keeps only what was spent), and the counter says so: at
    // least what it held above, more if a renewal topped the lease up since.
    BOOST_TEST(f.count("SELECT granted_cents - spent_cents FROM vault_leases WHERE closed_by = 'holder'") ==
               0);
    BOOST_TEST(sample(text, "chargeguard_vault_lease_returned_cents_total") >= static_cast<double>(held),
               text);
    BOOST_TEST(sample(text, "chargeguard_vault_leases_stranded_total") == 0, text);
}

BOOST_AUTO_TEST_SUITE_END()
