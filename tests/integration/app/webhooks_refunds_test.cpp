// The webhook receiver against a real PostgreSQL (webhooks_fixture.hpp): refund events reach the vault
// reservation that settled the charge, once by refund id, giving cap room back only under the key's policy,
// and failed or canceled refunds give back what they took.
#include <boost/test/unit_test.hpp>

#include "webhooks_fixture.hpp"

BOOST_FIXTURE_TEST_SUITE(webhooks, webhooks_fixture)

// A charge.refunded delivery reaches the vault reservation that settled the charge (by its charge id) or its
// PaymentIntent (by payment_intent): the refund is recorded on it, and the cap room comes back only under
// the key's refunds_reopen_cap, once, whatever the redeliveries and replays of older refund events.
BOOST_AUTO_TEST_CASE(a_refund_reopens_vault_cap_room_only_under_the_keys_policy_and_once) {
    auto sql = [&](const std::string& text) {
        return run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.err().describe()));
            auto r = co_await (*c)->query_with(text, pg::params(), 5s);
            BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
            co_return r->empty() ? std::string() : std::string(r->text(0, 0));
        });
    };
    for (const std::string k : {"vk_default", "vk_reopen"})
        sql("INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency, "
            "allowed_endpoints) VALUES ('" +
            k + "', '" + k + "', sha256(convert_to('" + k +
            "', 'UTF8')), '2026-12', 5000, 'usd', '{charges.create,payment_intents.create}')");
    sql("UPDATE vault_keys SET refunds_reopen_cap = true WHERE id = 'vk_reopen'");
    // Settled by a charges.create (ch_…) and by a payment_intents.create (pi_…).
    sql("INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, stripe_object_id) "
        "VALUES ('vk_default', 'idem-d', 1000, 'settled', 'ch_vdef'), "
        "('vk_reopen', 'idem-r', 1000, 'settled', 'pi_vreo')");
    auto committed = [&](const std::string& k) {
        return std::stoll(sql("SELECT committed_cents FROM vault_keys WHERE id = '" + k + "'"));
    };
    auto spend = [&](const std::string& k) {
        return sql("SELECT refunded_cents || '/' || reopened_cents FROM vault_spend WHERE vault_key_id = '" +
                   k + "'");
    };
    BOOST_TEST_REQUIRE(committed("vk_default") == 1000);
    BOOST_TEST_REQUIRE(committed("vk_reopen") == 1000);
    auto refunded = [](const std::string& evt, std::int64_t created, const std::string& charge,
                       const std::string& intent, std::int64_t amount) {
        return R"({"id":")" + evt +
               R"(","object":"event","api_version":"2024-06-20","type":"charge.refunded","created":)" +
               std::to_string(created) + R"(,"livemode":false,"data":{"object":{"id":")" + charge +
               R"(","object":"charge","status":"succeeded","amount":1000,"payment_intent":")" + intent +
               R"(","amount_refunded":)" + std::to_string(amount) + "}}}";
    };
    const auto t0 = now_unix() - 60;

    // Default policy: the refund is recorded, the cap room stays committed (duplicate too).
    const auto d1 = refunded("evt_vd_1", t0, "ch_vdef", "pi_vdef", 400);
    BOOST_TEST(send(delivery(d1, current_secret, now_unix())).status == 200);
    BOOST_TEST(send(delivery(d1, current_secret, now_unix())).status == 200);
    BOOST_TEST(committed("vk_default") == 1000);
    BOOST_TEST(spend("vk_default") == "400/0");

    // refunds_reopen_cap: the room comes back by the cumulative amount_refunded, found by payment_intent.
    const auto r1 = refunded("evt_vr_1", t0 + 1, "ch_vreo", "pi_vreo", 300);
    BOOST_TEST(send(delivery(r1, current_secret, now_unix())).status == 200);
    BOOST_TEST(committed("vk_reopen") == 700);
    BOOST_TEST(send(delivery(r1, current_secret, now_unix())).status == 200);  // duplicate
    BOOST_TEST(committed("vk_reopen") == 700);
    const auto r2 = refunded("evt_vr_2", t0 + 2, "ch_vreo", "pi_vreo", 800);
    BOOST_TEST(send(delivery(r2, current_secret, now_unix())).status == 200);
    BOOST_TEST(committed("vk_reopen") == 200);
    // An older refund event replayed (as a duplicate, and as one first seen now): nothing counts twice or
    // comes back smaller.
    BOOST_TEST(send(delivery(r1, current_secret, now_unix())).status == 200);
    const auto r0 = refunded("evt_vr_0", t0, "ch_vreo", "pi_vreo", 100);
    BOOST_TEST(send(delivery(r0, current_secret, now_unix())).status == 200);
    BOOST_TEST(send(delivery(r2, current_secret, now_unix())).status == 200);
    BOOST_TEST(committed("vk_reopen") == 200);
    BOOST_TEST(spend("vk_reopen") == "800/800");
    BOOST_TEST(committed("vk_default") == 1000);
    BOOST_TEST(std::stoll(sql("SELECT sum(amount_cents - reopened_cents) FROM vault_spend WHERE state = "
                              "'settled' AND vault_key_id = 'vk_reopen'")) == committed("vk_reopen"));
    auto fams = test::parse_prometheus(reg.render());
    BOOST_TEST(fams.at("chargeguard_webhook_vault_refunds_total").samples.at(0).value == 8);
    BOOST_TEST(outcome("error") == 0);
}

// Refund object events (refund.created, refund.updated, charge.refund.updated) reach the vault
// reservation of their charge or PaymentIntent too, keyed on the refund id: the same refund reported by
// charge.refunded and by its own events, in either order and duplicated, reopens its room once; a refund
// that fails or is canceled gives the amount back (the room closes again), and a late event of it does not
// reopen it. Room reopened before the key's policy turned false stays reopened; later refunds reopen none.
BOOST_AUTO_TEST_CASE(refund_events_reach_the_vault_once_by_refund_id_and_failures_give_back) {
    auto sql = [&](const std::string& text) {
        return run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.err().describe()));
            auto r = co_await (*c)->query_with(text, pg::params(), 5s);
            BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
            co_return r->empty() ? std::string() : std::string(r->text(0, 0));
        });
    };
    sql("INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency, "
        "allowed_endpoints, refunds_reopen_cap) VALUES ('vk_re', 'vk_re', sha256(convert_to('vk_re', "
        "'UTF8')), "
        "'2026-12', 5000, 'usd', '{payment_intents.create}', true)");
    sql("INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, stripe_object_id) "
        "VALUES ('vk_re', 'idem-re', 1000, 'settled', 'pi_vre')");
    auto committed = [&] {
        return std::stoll(sql("SELECT committed_cents FROM vault_keys WHERE id = 'vk_re'"));
    };
    auto spend = [&] {
        return sql(
            "SELECT refunded_cents || '/' || reopened_cents FROM vault_spend WHERE vault_key_id = 'vk_re'");
    };
    auto exact = [&] {
        return std::stoll(sql("SELECT sum(amount_cents - reopened_cents) FROM vault_spend WHERE state = "
                              "'settled' AND vault_key_id = 'vk_re'")) == committed();
    };
    const auto t0 = now_unix() - 120;
    int seq = 0;
    auto refund = [&](const std::string& type, const std::string& re, std::int64_t amount,
                      const std::string& status, std::int64_t at) {
        return R"({"id":"evt_vre_)" + std::to_string(++seq) +
               R"(","object":"event","api_version":"2024-06-20","type":")" + type + R"(","created":)" +
               std::to_string(at) + R"(,"livemode":false,"data":{"object":{"id":")" + re +
               R"(","object":"refund","amount":)" + std::to_string(amount) +
               R"(,"charge":"ch_vre","payment_intent":"pi_vre","currency":"usd","status":")" + status +
               R"(","metadata":{}}}})";
    };
    auto charge_refunded = [&](std::int64_t cumulative, std::int64_t at) {
        return R"({"id":"evt_vre_)" + std::to_string(++seq) +
               R"(","object":"event","api_version":"2024-06-20","type":"charge.refunded","created":)" +
               std::to_string(at) +
               R"(,"livemode":false,"data":{"object":{"id":"ch_vre","object":"charge","status":"succeeded",)"
               R"("amount":1000,"payment_intent":"pi_vre","amount_refunded":)" +
               std::to_string(cumulative) + "}}}";
    };
    auto deliver = [&](const std::string& body) {
        BOOST_TEST(send(delivery(body, current_secret, now_unix())).status == 200);
        BOOST_TEST(send(delivery(body, current_secret, now_unix())).status == 200);  // a duplicate
    };
    BOOST_TEST_REQUIRE(committed() == 1000);
    // re_1 (300): its refund.created first, then its charge's charge.refunded, then refund.updated.
    deliver(refund("refund.created", "re_v1", 300, "pending", t0));
    BOOST_TEST(spend() == "300/300");
    BOOST_TEST(committed() == 700);
    deliver(charge_refunded(300, t0));
    deliver(refund("refund.updated", "re_v1", 300, "succeeded", t0 + 5));
    BOOST_TEST(spend() == "300/300");
    BOOST_TEST(committed() == 700);
    // re_2 (200): charge.refunded first (cumulative 500), then refund.created, late.
    deliver(charge_refunded(500, t0 + 10));
    BOOST_TEST(spend() == "500/500");
    deliver(refund("refund.created", "re_v2", 200, "pending", t0 + 10));
    BOOST_TEST(spend() == "500/500");
    BOOST_TEST(committed() == 500);
    // re_2 fails: 200 given back, its room closes again; its late refund.updated (pending) changes nothing.
    deliver(refund("refund.updated", "re_v2", 200, "failed", t0 + 20));
    BOOST_TEST(spend() == "300/300");
    BOOST_TEST(committed() == 700);
    deliver(refund("refund.updated", "re_v2", 200, "pending", t0 + 12));
    deliver(charge_refunded(500, t0 + 10));  // an older charge.refunded, first seen now
    BOOST_TEST(spend() == "300/300");
    BOOST_TEST(committed() == 700);
    BOOST_TEST(exact());
    // The policy turns false: re_1's 300 stays reopened; re_3 (400) is recorded and reopens nothing.
    sql("UPDATE vault_keys SET refunds_reopen_cap = false WHERE id = 'vk_re'");
    deliver(refund("refund.created", "re_v3", 400, "succeeded", t0 + 30));
    BOOST_TEST(spend() == "700/300");
    BOOST_TEST(committed() == 700);
    // re_1 canceled (charge.refund.updated): its 300 back, and the room it reopened closes (at most).
    deliver(refund("charge.refund.updated", "re_v1", 300, "canceled", t0 + 40));
    BOOST_TEST(spend() == "400/0");
    BOOST_TEST(committed() == 1000);
    BOOST_TEST(exact());
    BOOST_TEST(sql("SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM stripe_refunds") ==
               "re_v1:canceled,re_v2:failed,re_v3:succeeded");
    BOOST_TEST(outcome("error") == 0);
}

BOOST_AUTO_TEST_SUITE_END()
