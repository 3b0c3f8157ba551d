// The webhook receiver (app/webhook_receiver) against a real PostgreSQL: a scratch database with the
// migrations applied, deliveries dispatched through the receiver's routes as the HTTP server would, and
// the table and the metrics read back. The last case stops and restarts the shared server (not parallel).
// Here deliveries recorded, signatures, and availability (a busy pool, PostgreSQL down); refunds reaching the
// vault are webhooks_refunds_test.cpp, facts about other payments webhooks_foreign_test.cpp.
#define BOOST_TEST_MODULE webhooks
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "support/pg_main.hpp"
#include "webhooks_fixture.hpp"

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
