// The webhook receiver (app/webhook_receiver) against a real PostgreSQL: a scratch database with the
// migrations applied, deliveries dispatched through the receiver's routes as the HTTP server would, and
// the table and the metrics read back. The last case stops and restarts the shared server (not parallel).
#define BOOST_TEST_MODULE webhooks
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <chrono>

#include "app/webhook_receiver.hpp"
#include "integration/pg/support.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "pg/migrations.hpp"
#include "stripe/webhook_signature.hpp"
#include "support/pg_main.hpp"
#include "support/pg_server_ctl.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using test::run_async;

namespace {

const std::string current_secret = "whsec_receiver_current";
const std::string previous_secret = "whsec_receiver_previous";

std::int64_t now_unix() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string event_body(const std::string& id, std::int64_t created,
                       const std::string& type = "charge.refunded") {
    return R"({"id":")" + id + R"(","object":"event","type":")" + type + R"(","created":)" +
           std::to_string(created) + R"(,"livemode":false,"data":{"object":{"id":"ch_)" + id +
           R"(","object":"charge","amount_refunded":500}}})";
}

http::request delivery(const std::string& body, const std::string& secret, std::int64_t t) {
    http::request r;
    r.method = "POST";
    r.target = "/stripe/webhooks";
    r.body = body;
    r.headers.add("Content-Type", "application/json; charset=utf-8");
    r.headers.add("Stripe-Signature",
                  "t=" + std::to_string(t) + ",v1=" + to_hex(stripe::compute_signature(secret, t, body)));
    return r;
}

struct webhooks_fixture {
    asio::io_context io{1};
    net::offload_pool offload{2};
    test::scratch_db db{"webhooks"};
    metrics::registry reg;
    std::shared_ptr<pg::pool> pool;
    std::unique_ptr<app::webhook_receiver> rx;
    http::router routes;

    webhooks_fixture() {
        pg::pool_options o;
        o.server = db.config();
        o.server.connect_timeout = 2s;
        o.size = 2;
        o.backoff_max = 200ms;
        pool = pg::pool::create(io.get_executor(), offload.get_executor(), std::move(o), logger());
        // The migration's error, or empty (result<T> has no default constructor, which co_spawn needs).
        auto migrate_error = run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            if (!c) co_return c.err().describe();
            auto ms = pg::embedded_migrations();
            if (!ms) co_return ms.err().describe();
            auto m = co_await pg::migrate(**c, *ms, {}, logger());
            co_return m ? std::string() : m.err().describe();
        });
        BOOST_TEST_REQUIRE(migrate_error.empty(), migrate_error);
        app::webhook_receiver_config cfg;
        cfg.secrets = {current_secret, previous_secret};
        cfg.max_body_bytes = 4096;
        rx = std::make_unique<app::webhook_receiver>(cfg, pool, logger(), reg);
        routes = rx->routes();
    }
    ~webhooks_fixture() {
        try {
            run_async(io, [&]() -> net::awaitable<void> { co_await pool->close(); });
        } catch (...) {
        }
    }

    http::response send(http::request req) {
        return run_async(
            io, [&]() -> net::awaitable<http::response> { co_return co_await routes.dispatch(req); });
    }

    std::int64_t count_rows(const std::string& where = "true") {
        return run_async(io, [&]() -> net::awaitable<std::int64_t> {
            auto c = co_await pool->acquire();
            BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.err().describe()));
            auto r = co_await (*c)->query_with("SELECT count(*) FROM stripe_webhook_events WHERE " + where,
                                               pg::params(), 5s);
            BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
            co_return std::stoll(std::string(r->text(0, 0)));
        });
    }

    double outcome(const std::string& o) {
        auto fams = test::parse_prometheus(reg.render());
        for (const auto& s : fams.at("chargeguard_webhook_deliveries_total").samples)
            if (s.labels.at("outcome") == o) return s.value;
        BOOST_FAIL("no outcome " + o);
        return -1;
    }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(webhooks, webhooks_fixture)

BOOST_AUTO_TEST_CASE(a_signed_delivery_is_recorded_once_and_a_duplicate_acknowledged) {
    const auto created = now_unix() - 3;
    const auto body = event_body("evt_rec_1", created);
    auto r = send(delivery(body, current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(count_rows() == 1);
    BOOST_TEST(
        count_rows("id = 'evt_rec_1' AND type = 'charge.refunded' AND NOT livemode AND object_id = "
                   "'ch_evt_rec_1' AND created = to_timestamp(" +
                   std::to_string(created) +
                   ") AND payload->'data'->'object'->>'amount_refunded' = '500' AND received_at <= now()") ==
        1);
    // Stripe redelivers (signed afresh): acknowledged, not recorded again.
    r = send(delivery(body, current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(r.body.find("duplicate") != std::string::npos);
    BOOST_TEST(count_rows() == 1);
    BOOST_TEST(outcome("recorded") == 1);
    BOOST_TEST(outcome("duplicate") == 1);
    auto fams = test::parse_prometheus(reg.render());
    const auto& lag = fams.at("chargeguard_webhook_lag_seconds");
    BOOST_TEST(test::bucket_count(lag, "+Inf") == 1);
    BOOST_TEST(test::bucket_count(lag, "0.5") == 0);  // created 3 s before it was received
}

// A delivery about a payment the ledger left processing is applied to that row in the transaction that
// records it: payment_failed → failed_after_processing with one dead letter, counted; the redelivery is a
// duplicate and changes nothing; an event about a charge no row names is recorded as unknown_object.
BOOST_AUTO_TEST_CASE(a_delivery_settles_the_ledger_row_it_names) {
    const std::string key = "0123456789abcdef0123456789abcdef";
    auto seeded = run_async(io, [&]() -> net::awaitable<std::string> {
        auto c = co_await pool->acquire();
        if (!c) co_return c.err().describe();
        auto r = co_await (*c)->query_with(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, payment_intent_id, charge_id, processing_since, raw_body, "
            "nsq_topic, "
            "nsq_channel, nsq_message_id) VALUES ($1, 'c-1', '2026-12', 1999, 'usd', 'cus_1', 'processing', "
            "'pi_hook', 'ch_hook', now(), convert_to('{\"customer_id\":\"c-1\"}', 'UTF8'), 'billing', "
            "'chargeguard', 'm-1')",
            pg::params(key), 5s);
        co_return r ? std::string() : r.err().describe();
    });
    BOOST_TEST_REQUIRE(seeded.empty(), seeded);
    const std::string failed =
        R"({"id":"evt_fail_1","object":"event","type":"payment_intent.payment_failed","created":)" +
        std::to_string(now_unix()) +
        R"(,"livemode":false,"data":{"object":{"id":"pi_hook","object":"payment_intent",)"
        R"("status":"requires_payment_method","latest_charge":"ch_hook","metadata":{"billing_key":")" +
        key + R"("},"last_payment_error":{"code":"insufficient_funds"}}}})";
    auto r = send(delivery(failed, current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(send(delivery(failed, current_secret, now_unix())).status == 200);  // Stripe's retry
    BOOST_TEST(send(delivery(event_body("evt_stranger", now_unix()), current_secret, now_unix())).status ==
               200);
    auto q = [&](const std::string& sql) {
        return run_async(io, [&]() -> net::awaitable<std::int64_t> {
            auto c = co_await pool->acquire();
            BOOST_TEST_REQUIRE(c.has_value());
            auto rows = co_await (*c)->query_with(sql, pg::params(), 5s);
            BOOST_TEST_REQUIRE(rows.has_value(), (rows ? "" : rows.err().describe()));
            co_return std::stoll(std::string(rows->text(0, 0)));
        });
    };
    BOOST_TEST(q("SELECT count(*) FROM billing_records WHERE status = 'failed_after_processing' AND "
                 "stripe_status = 'requires_payment_method' AND last_error LIKE '%insufficient_funds%'") ==
               1);
    BOOST_TEST(
        q("SELECT count(*) FROM dead_letters WHERE billing_key = '" + key +
          "' AND reason LIKE 'failed after processing%' AND topic = 'billing' AND nsq_message_id = 'm-1'") ==
        1);
    BOOST_TEST(count_rows("id = 'evt_fail_1' AND outcome = 'applied' AND applied_to = '" + key + "'") == 1);
    BOOST_TEST(count_rows("id = 'evt_stranger' AND outcome = 'unknown_object'") == 1);
    auto fams = test::parse_prometheus(reg.render());
    auto result_of = [&](const std::string& res) {
        for (const auto& smp : fams.at("chargeguard_webhook_events_total").samples)
            if (smp.labels.at("result") == res) return smp.value;
        return -1.0;
    };
    BOOST_TEST(result_of("applied") == 1);
    BOOST_TEST(result_of("unknown_object") == 1);
    BOOST_TEST(fams.at("chargeguard_billing_failed_after_processing_total").samples.at(0).value == 1);
    BOOST_TEST(outcome("duplicate") == 1);
}

BOOST_AUTO_TEST_CASE(the_previous_secret_is_accepted_during_a_rotation) {
    auto r = send(delivery(event_body("evt_rot_1", now_unix()), previous_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(count_rows("id = 'evt_rot_1'") == 1);
}

BOOST_AUTO_TEST_CASE(bad_signatures_are_refused_and_nothing_is_recorded) {
    const auto body = event_body("evt_bad_1", now_unix());
    auto req = delivery(body, "whsec_someone_else", now_unix());
    BOOST_TEST(send(req).status == 400);
    req = delivery(body, current_secret, now_unix());
    req.headers.remove("Stripe-Signature");
    BOOST_TEST(send(req).status == 400);  // unsigned
    req = delivery(body, current_secret, now_unix());
    req.body = event_body("evt_bad_2", now_unix());  // signed for another body
    BOOST_TEST(send(req).status == 400);
    req = delivery(body, current_secret, now_unix());
    req.headers.set("Stripe-Signature", "t=1,v1=zz");
    BOOST_TEST(send(req).status == 400);  // malformed header
    BOOST_TEST(outcome("bad_signature") == 4);
    BOOST_TEST(count_rows() == 0);
}

BOOST_AUTO_TEST_CASE(stale_and_future_signatures_are_refused) {
    const auto body = event_body("evt_stale_1", now_unix() - 3600);
    BOOST_TEST(send(delivery(body, current_secret, now_unix() - 3600)).status == 400);
    BOOST_TEST(send(delivery(body, current_secret, now_unix() + 3600)).status == 400);
    BOOST_TEST(outcome("stale") == 2);
    BOOST_TEST(count_rows() == 0);
}

BOOST_AUTO_TEST_CASE(oversized_non_json_and_wrong_method) {
    auto big = event_body("evt_big_1", now_unix());
    big.insert(big.size() - 1, R"(,"pad":")" + std::string(5000, 'x') + "\"");
    BOOST_TEST(send(delivery(big, current_secret, now_unix())).status == 413);
    BOOST_TEST(outcome("too_large") == 1);
    BOOST_TEST(send(delivery("not json at all", current_secret, now_unix())).status == 400);
    BOOST_TEST(send(delivery(R"({"object":"event"})", current_secret, now_unix())).status == 400);
    BOOST_TEST(outcome("malformed") == 2);
    auto get = delivery(event_body("evt_get_1", now_unix()), current_secret, now_unix());
    get.method = "GET";
    BOOST_TEST(send(get).status == 405);
    BOOST_TEST(count_rows() == 0);
}

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
        return R"({"id":")" + evt + R"(","object":"event","type":"charge.refunded","created":)" +
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
        return R"({"id":"evt_vre_)" + std::to_string(++seq) + R"(","object":"event","type":")" + type +
               R"(","created":)" + std::to_string(at) + R"(,"livemode":false,"data":{"object":{"id":")" + re +
               R"(","object":"refund","amount":)" + std::to_string(amount) +
               R"(,"charge":"ch_vre","payment_intent":"pi_vre","currency":"usd","status":")" + status +
               R"(","metadata":{}}}})";
    };
    auto charge_refunded = [&](std::int64_t cumulative, std::int64_t at) {
        return R"({"id":"evt_vre_)" + std::to_string(++seq) +
               R"(","object":"event","type":"charge.refunded","created":)" + std::to_string(at) +
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

BOOST_AUTO_TEST_CASE(postgres_down_answers_500_and_the_redelivery_after_restart_is_recorded) {
    test::pg_server_ctl srv("stop and start the server");
    BOOST_TEST(count_rows() == 0);  // a connection is open and idle in the pool
    BOOST_TEST_REQUIRE(srv.run("stop") == 0);
    struct restart_on_exit {
        const test::pg_server_ctl& s;
        bool done = false;
        ~restart_on_exit() {
            if (!done) s.run("start");
        }
    } guard{srv};
    const auto body = event_body("evt_down_1", now_unix());
    auto r = send(delivery(body, current_secret, now_unix()));
    BOOST_TEST(r.status == 500, r.body);
    BOOST_TEST(outcome("error") >= 1);
    BOOST_TEST_REQUIRE(srv.run("start") == 0);
    guard.done = true;
    // Stripe retries on its own schedule; the pool comes back after its reconnect backoff. Every answer
    // until then is a 500 (never a 2xx without the row), and one redelivery is recorded.
    int status = 0;
    for (auto deadline = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < deadline;) {
        status = send(delivery(body, current_secret, now_unix())).status;
        if (status != 500) break;
        run_async(io, []() -> net::awaitable<void> { co_await net::sleep_for(50ms); });
    }
    BOOST_TEST(status == 200);
    BOOST_TEST(count_rows("id = 'evt_down_1'") == 1);
    BOOST_TEST(outcome("recorded") == 1);
}

BOOST_AUTO_TEST_SUITE_END()
