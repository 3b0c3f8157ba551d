// What the webhook receiver's tests share (webhooks_test.cpp, webhooks_refunds_test.cpp,
// webhooks_foreign_test.cpp): a scratch database with the migrations applied, the receiver's routes called as
// the HTTP server would, signed deliveries, and the table and the metrics read back.
#pragma once

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
#include "support/pg_server_ctl.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using test::run_async;

namespace {

const std::string current_secret = "whsec_receiver_current";
const std::string previous_secret = "whsec_receiver_previous";

inline std::int64_t now_unix() {
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

inline http::request delivery(const std::string& body, const std::string& secret, std::int64_t t) {
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
