// The webhook receiver (app/webhook_receiver) against a real PostgreSQL: a scratch database with the
// migrations applied, deliveries dispatched through the receiver's routes as the HTTP server would, and
// the table and the metrics read back. The last case stops and restarts the shared server (not parallel).
#define BOOST_TEST_MODULE webhooks
#define BOOST_TEST_NO_MAIN
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "app/webhook_receiver.hpp"
#include "billing/store/abandoned_sql.hpp"
#include "integration/pg/support.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "pg/migrations.hpp"
#include "stripe/webhook_signature.hpp"
#include "support/loops.hpp"
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
    return R"({"id":")" + id + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(created) + R"(,"livemode":false,"data":{"object":{"id":"ch_)" +
           id + R"(","object":"charge","amount_refunded":500}}})";
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

// Its pool and receiver outlive the handlers left on the loops (loops.hpp).
struct webhooks_fixture : test::loops {
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
        o.server_wait = 300ms;  // how long a delivery waits for a pooled connection before 503 (busy)
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
        shut_down();
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

    // The first cell of `text`'s result, as text ("" for NULL).
    std::string sql(const std::string& text) {
        return run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            BOOST_TEST_REQUIRE(c.has_value(), (c ? "" : c.err().describe()));
            auto r = co_await (*c)->query_with(text, pg::params(), 5s);
            BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
            if (r->empty()) co_return std::string();
            co_return std::string(r->text(0, 0));
        });
    }

    // A row processing: Stripe answered with its PaymentIntent `pi` (no charge yet), in `account` (empty:
    // the platform), with the delivery a dead letter would carry.
    void seed_processing(const std::string& key, const std::string& customer, const std::string& pi,
                         const std::string& account = {}) {
        auto seeded = run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            if (!c) co_return c.err().describe();
            auto r = co_await (*c)->query_with(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status, payment_intent_id, processing_since, raw_body, nsq_topic, "
                "nsq_channel, nsq_message_id, stripe_account) VALUES ($1, $2, '2026-12', 1999, 'usd', "
                "'cus_1', 'processing', $3, now(), convert_to('{}', 'UTF8'), 'billing', 'chargeguard', "
                "'m-' || $1, NULLIF($4, ''))",
                pg::params(key, customer, pi, account), 5s);
            co_return r ? std::string() : r.err().describe();
        });
        BOOST_TEST_REQUIRE(seeded.empty(), seeded);
    }

    double events_result(const std::string& res) {
        auto fams = test::parse_prometheus(reg.render());
        for (const auto& smp : fams.at("chargeguard_webhook_events_total").samples)
            if (smp.labels.at("result") == res) return smp.value;
        BOOST_FAIL("no result " + res);
        return -1;
    }

    double counter(const std::string& name) {
        return test::parse_prometheus(reg.render()).at(name).samples.at(0).value;
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
        R"({"id":"evt_fail_1","object":"event","api_version":"2024-06-20","type":"payment_intent.payment_failed","created":)" +
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

namespace {

// A charge event: `pi` empty for a charge made without a PaymentIntent (by hand, /v1/charges); the row's key
// in its metadata, as another integration or a support agent copying it would leave it.
std::string charge_event(const std::string& evt, const std::string& type, const std::string& charge,
                         const std::string& pi, const std::string& status, const std::string& key) {
    return R"({"id":")" + evt + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,"data":{"object":{"id":")" +
           charge + R"(","object":"charge","status":")" + status + R"(","payment_intent":)" +
           (pi.empty() ? std::string("null") : "\"" + pi + "\"") +
           R"(,"failure_code":"card_declined","metadata":{"billing_key":")" + key + R"("}}}})";
}

// A PaymentIntent event, from `account` (Connect; empty: the platform's own, no "account" field).
std::string intent_event(const std::string& evt, const std::string& type, const std::string& pi,
                         const std::string& status, const std::string& key, const std::string& account = {}) {
    return R"({"id":")" + evt + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,)" +
           (account.empty() ? std::string() : R"("account":")" + account + R"(",)") +
           R"("data":{"object":{"id":")" + pi + R"(","object":"payment_intent","status":")" + status +
           R"(","latest_charge":"ch_)" + pi + R"(","last_payment_error":{"code":"insufficient_funds"},)" +
           R"("metadata":{"billing_key":")" + key + R"("}}}})";
}

}  // namespace

// A charge.failed for a charge that carries the row's billing_key but is not its PaymentIntent's (made by
// hand, no PaymentIntent; or another integration's, another one): recorded, other_payment, the processing
// row untouched and no dead letter (a replay would charge again while the real debit may still succeed).
BOOST_AUTO_TEST_CASE(a_foreign_charge_failed_moves_nothing_and_writes_no_letter) {
    const std::string key = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    seed_processing(key, "c-foreign-1", "pi_own_1");
    auto r = send(delivery(charge_event("evt_ff_1", "charge.failed", "ch_by_hand", "", "failed", key),
                           current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    r = send(delivery(charge_event("evt_ff_2", "charge.failed", "ch_other_integration",
                                   "pi_other_integration", "failed", key),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') FROM billing_records WHERE key = '" +
                   key + "'") == "processing/-");
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
    BOOST_TEST(count_rows("id IN ('evt_ff_1', 'evt_ff_2') AND outcome = 'other_payment' AND applied_to = '" +
                          key + "'") == 2);
    BOOST_TEST(outcome("other_payment") == 2);
    BOOST_TEST(outcome("recorded") == 0);
    BOOST_TEST(events_result("other_payment") == 2);
    BOOST_TEST(counter("chargeguard_billing_failed_after_processing_total") == 0);
}

// A charge.succeeded of such a foreign charge does not mark the row charged; the row's own
// payment_intent.payment_failed afterwards applies: failed_after_processing, its dead letter.
BOOST_AUTO_TEST_CASE(a_foreign_charge_succeeded_does_not_mark_the_row_paid) {
    const std::string key = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    seed_processing(key, "c-foreign-2", "pi_own_2");
    auto r =
        send(delivery(charge_event("evt_fs_1", "charge.succeeded", "ch_foreign_ok", "", "succeeded", key),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') FROM billing_records WHERE key = '" +
                   key + "'") == "processing/-");
    BOOST_TEST(count_rows("id = 'evt_fs_1' AND outcome = 'other_payment'") == 1);
    r = send(delivery(
        intent_event("evt_fs_2", "payment_intent.payment_failed", "pi_own_2", "requires_payment_method", key),
        current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(count_rows("id = 'evt_fs_2' AND outcome = 'applied'") == 1);
    BOOST_TEST(sql("SELECT status FROM billing_records WHERE key = '" + key + "'") ==
               "failed_after_processing");
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters WHERE billing_key = '" + key + "'") == "1");
    BOOST_TEST(counter("chargeguard_billing_failed_after_processing_total") == 1);
}

// Rows that hold no Stripe id can only be found by metadata. The receiver applies no such fact: a pending
// row's is deferred and marks the row for the sweeper (abandoned_sql::record_has_deferred_fact); a verdict
// the pipeline reached without a Stripe object (declined with no charge, cap_blocked, failed) stands, the
// fact unconfirmed, no alert. Each row is left as it was.
BOOST_AUTO_TEST_CASE(a_fact_found_by_metadata_only_moves_no_row) {
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"pending", "d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0"},
        {"declined", "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1"},
        {"cap_blocked", "d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2"},
        {"failed", "d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3"},
    };
    for (const auto& [status, key] : rows) {
        auto seeded = run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            if (!c) co_return c.err().describe();
            auto r = co_await (*c)->query_with(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status) VALUES ($1, 'c-' || $2, '2026-12', 1999, 'usd', 'cus_1', $2)",
                pg::params(key, status), 5s);
            co_return r ? std::string() : r.err().describe();
        });
        BOOST_TEST_REQUIRE(seeded.empty(), seeded);
        auto r = send(delivery(
            charge_event("evt_md_" + status, "charge.succeeded", "ch_md_" + status, "", "succeeded", key),
            current_secret, now_unix()));
        BOOST_TEST(r.status == 200, r.body);
        BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') || '/' || "
                       "coalesce(payment_intent_id, '-') FROM billing_records WHERE key = '" +
                       key + "'") == status + "/-/-");
        const std::string want = status == "pending" ? "deferred" : "unconfirmed";
        BOOST_TEST(count_rows("id = 'evt_md_" + status + "' AND outcome = '" + want + "' AND applied_to = '" +
                              key + "'") == 1,
                   status);
        const std::string marked = sql("SELECT count(*) FROM billing_records WHERE key = '" + key + "' AND " +
                                       billing::abandoned_sql::record_has_deferred_fact);
        BOOST_TEST(marked == (status == "pending" ? "1" : "0"), status);
    }
    BOOST_TEST(events_result("deferred") == 1);
    BOOST_TEST(events_result("unconfirmed") == 3);
    BOOST_TEST(events_result("applied") == 0);
    BOOST_TEST(counter("chargeguard_billing_settlement_anomalies_total") == 0);
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
}

// A Connect endpoint receives every connected account's events: an event from another account, or the
// platform's, naming the row's very PaymentIntent id, moves nothing; the row's own account's applies.
BOOST_AUTO_TEST_CASE(an_event_from_another_account_moves_nothing) {
    const std::string key = "c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2";
    seed_processing(key, "c-connect-1", "pi_connect_1", "acct_Rowsown");
    auto status = [&] { return sql("SELECT status FROM billing_records WHERE key = '" + key + "'"); };
    auto r = send(delivery(intent_event("evt_xa_1", "payment_intent.payment_failed", "pi_connect_1",
                                        "requires_payment_method", key, "acct_Someoneelse"),
                           current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    r = send(
        delivery(intent_event("evt_xa_2", "payment_intent.succeeded", "pi_connect_1", "succeeded", key, ""),
                 current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status() == "processing");
    BOOST_TEST(count_rows("id IN ('evt_xa_1', 'evt_xa_2') AND outcome = 'other_payment'") == 2);
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
    r = send(delivery(intent_event("evt_xa_3", "payment_intent.succeeded", "pi_connect_1", "succeeded", key,
                                   "acct_Rowsown"),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status() == "charged");
    BOOST_TEST(outcome("other_payment") == 2);
    BOOST_TEST(outcome("recorded") == 1);
}

// Genuinely signed events no table can hold: answered 400 once with the refusal recorded (reason, body),
// then acknowledged (Stripe would otherwise redeliver for three days, each a 500 paging as an error).
BOOST_AUTO_TEST_CASE(poison_events_are_refused_once_and_recorded_with_their_reason) {
    const std::string head = R"({"object":"event","api_version":"2024-06-20","type":"charge.succeeded",)";
    const std::string int64_max = std::to_string(std::numeric_limits<std::int64_t>::max());
    const std::vector<std::pair<std::string, std::string>> poison = {
        {"evt_poison_time", R"({"id":"evt_poison_time",)" + head.substr(1) + R"("created":)" + int64_max +
                                R"(,"data":{"object":{"id":"ch_p1","object":"charge"}}})"},
        {"evt_poison_nul",
         R"({"id":"evt_poison_nul",)" + head.substr(1) + R"("created":)" + std::to_string(now_unix()) +
             R"(,"data":{"object":{"id":"ch_p2","object":"charge","metadata":{"note":"a\u0000b"}}}})"},
        {"evt_poison_dup",
         R"({"id":"evt_poison_dup",)" + head.substr(1) + R"("created":)" + std::to_string(now_unix()) +
             R"(,"id":"evt_poison_other","data":{"object":{"id":"ch_p3","object":"charge"}}})"},
    };
    for (const auto& [id, body] : poison) {
        BOOST_TEST_CONTEXT(id) {
            auto r = send(delivery(body, current_secret, now_unix()));
            BOOST_TEST(r.status == 400, r.body);
            r = send(delivery(body, current_secret, now_unix()));  // Stripe's retry
            BOOST_TEST(r.status == 200, r.body);
            BOOST_TEST(r.body.find("refused") != std::string::npos, r.body);
            BOOST_TEST(sql("SELECT deliveries || ' ' || encode(body, 'hex') FROM stripe_webhook_refusals "
                           "WHERE event_id = '" +
                           id + "' AND reason LIKE 'unstorable: %'") == "2 " + to_hex(body));
        }
    }
    BOOST_TEST(sql("SELECT reason FROM stripe_webhook_refusals WHERE event_id = 'evt_poison_dup'") ==
               "unstorable: the key \"id\" twice in $");
    BOOST_TEST(sql("SELECT reason FROM stripe_webhook_refusals WHERE event_id = 'evt_poison_time'")
                   .find("outside the years 1970 to 9999") != std::string::npos);
    BOOST_TEST(count_rows() == 0);
    BOOST_TEST(outcome("poison") == 3);
    BOOST_TEST(outcome("duplicate") == 3);
    BOOST_TEST(outcome("error") == 0);
}

// The receiver reads one API version: an event rendered in another (or naming none) is refused, every
// delivery, with the version to create the endpoint with; nothing of it reaches the ledger.
BOOST_AUTO_TEST_CASE(an_event_in_another_api_version_is_refused) {
    const std::string key = "b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3";
    seed_processing(key, "c-version-1", "pi_version_1");
    auto old = intent_event("evt_v_old", "payment_intent.payment_failed", "pi_version_1",
                            "requires_payment_method", key);
    const std::string current = R"("api_version":"2024-06-20")";
    old.replace(old.find(current), current.size(), R"("api_version":"2022-08-01")");
    auto r = send(delivery(old, current_secret, now_unix()));
    BOOST_TEST(r.status == 400, r.body);
    BOOST_TEST(send(delivery(old, current_secret, now_unix())).status == 400);  // every delivery
    auto none = intent_event("evt_v_none", "payment_intent.payment_failed", "pi_version_1",
                             "requires_payment_method", key);
    none.replace(none.find(current + ","), current.size() + 1, "");
    BOOST_TEST(send(delivery(none, current_secret, now_unix())).status == 400);
    BOOST_TEST(sql("SELECT deliveries || ' ' || reason FROM stripe_webhook_refusals WHERE event_id = "
                   "'evt_v_old'") ==
               "2 api_version 2022-08-01, the receiver reads 2024-06-20: create the endpoint with "
               "api_version 2024-06-20");
    BOOST_TEST(sql("SELECT api_version IS NULL FROM stripe_webhook_refusals WHERE event_id = 'evt_v_none'") ==
               "t");
    BOOST_TEST(sql("SELECT status FROM billing_records WHERE key = '" + key + "'") == "processing");
    BOOST_TEST(count_rows() == 0);
    BOOST_TEST(outcome("wrong_api_version") == 3);
}

// No pooled connection within the bound while PostgreSQL is up: 503 with Retry-After, counted busy (not
// error); and past max_in_flight deliveries being recorded, 503 at once. The delivery that waited is
// recorded once the connections come back.
BOOST_AUTO_TEST_CASE(a_busy_pool_answers_503_with_retry_after_counted_apart_from_errors) {
    app::webhook_receiver_config cfg;
    cfg.secrets = {current_secret};
    cfg.max_in_flight = 1;
    metrics::registry reg1;
    app::webhook_receiver one(cfg, pool, logger(), reg1);
    auto one_routes = one.routes();
    auto waited = delivery(event_body("evt_busy_wait", now_unix()), current_secret, now_unix());
    auto gated = delivery(event_body("evt_busy_gate", now_unix()), current_secret, now_unix());
    auto timed_out = delivery(event_body("evt_busy_pool", now_unix()), current_secret, now_unix());
    struct answers {
        int waited = 0, gated = 0, timed_out = 0;
        std::string retry_after;
    };
    auto a = run_async(io, [&]() -> net::awaitable<answers> {
        answers out;
        // Every pooled connection taken.
        auto c1 = co_await pool->acquire();
        auto c2 = co_await pool->acquire();
        BOOST_TEST_REQUIRE((c1.has_value() && c2.has_value()));
        // The pool's bound passes: busy.
        auto t = co_await routes.dispatch(timed_out);
        out.timed_out = t.status;
        out.retry_after = t.headers.get("Retry-After").value_or("");
        // One delivery waits for a connection in the receiver admitting one at a time...
        asio::steady_timer done(io, std::chrono::steady_clock::time_point::max());
        asio::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                auto w = co_await one_routes.dispatch(waited);
                out.waited = w.status;
                done.cancel();
            },
            asio::detached);
        co_await asio::post(io, asio::use_awaitable);
        // ...so the next is turned away at once.
        out.gated = (co_await one_routes.dispatch(gated)).status;
        c1->release();
        c2->release();
        if (out.waited == 0) co_await done.async_wait(net::nothrow);
        co_return out;
    });
    BOOST_TEST(a.timed_out == 503);
    BOOST_TEST(a.retry_after == "5");
    BOOST_TEST(a.gated == 503);
    BOOST_TEST(a.waited == 200);
    BOOST_TEST(outcome("busy") == 1);
    BOOST_TEST(outcome("error") == 0);
    auto fams = test::parse_prometheus(reg1.render());
    for (const auto& smp : fams.at("chargeguard_webhook_deliveries_total").samples) {
        if (smp.labels.at("outcome") == "busy") BOOST_TEST(smp.value == 1);
        if (smp.labels.at("outcome") == "recorded") BOOST_TEST(smp.value == 1);
        if (smp.labels.at("outcome") == "error") BOOST_TEST(smp.value == 0);
    }
    BOOST_TEST(count_rows("id = 'evt_busy_wait'") == 1);
    BOOST_TEST(count_rows("id IN ('evt_busy_gate', 'evt_busy_pool')") == 0);
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
