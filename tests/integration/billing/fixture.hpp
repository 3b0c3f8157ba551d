// The billing pipeline against real parts: a scratch PostgreSQL database with the migrations applied, an
// in-process fake-stripe over TLS, a stripe::client on the offload pool, and a pg::pool on the test's
// io_context (the "main loop": the fake, the pool and the pipeline all run there).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "billing/flow/charge_flow.hpp"
#include "billing/heal/pending_age.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "metrics/registry.hpp"
#include "net/boxed.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/integration/pg/support.hpp"
#include "tests/integration/stripe/fake_fixture.hpp"

namespace cg::test {

inline const std::string key_namespace = "test";

inline std::string event_json(const std::string& customer, const std::string& period, std::int64_t amount,
                              const std::string& stripe_customer = "cus_ok") {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","description":"plan )" + period + R"("})";
}

inline billing::delivery delivery_of(std::string body, std::string message_id, std::int32_t attempts = 1) {
    billing::delivery d;
    d.topic = "billing";
    d.channel = "chargeguard";
    d.message_id = std::move(message_id);
    d.attempts = attempts;
    d.body = std::move(body);
    return d;
}

inline std::string key_of(const std::string& customer, const std::string& period) {
    return billing::base_key(key_namespace, customer, period);
}

struct billing_fixture : fake_stripe_fixture {
    scratch_db db{"billing"};
    std::shared_ptr<pg::pool> pg;
    std::unique_ptr<stripe::client> stripe;
    std::unique_ptr<billing::ledger> ledger;
    std::chrono::seconds clock_offset{0};  // added to the pipeline's "now" (tests move time)

    billing_fixture() {
        pg = pool_for(db.config());
        auto migrated = run(boxed_migrate());
        BOOST_TEST_REQUIRE(migrated.has_value(), (migrated ? "" : migrated.err().describe()));
        auto sc = config();
        sc.request_timeout = std::chrono::seconds(10);  // slow-Stripe tests add latency on purpose
        stripe = client(sc);
        ledger = std::make_unique<billing::ledger>(pg);
    }
    ~billing_fixture() {
        try {
            run_async(io, [&]() -> net::awaitable<void> { co_await pg->close(); });
        } catch (...) {
        }
    }

    // Runs an awaitable returning result<T> (or anything) on the test's io_context and returns its value.
    template <typename T>
    T run(net::awaitable<T> a) {
        return std::move(*run_async(io, [&]() { return net::boxed(std::move(a)); }));
    }

    net::awaitable<result<pg::migrate_report>> boxed_migrate() {
        auto c = co_await pg->acquire();
        if (!c) co_return c.err();
        auto ms = pg::embedded_migrations();
        if (!ms) co_return ms.err();
        co_return co_await pg::migrate(**c, *ms, {}, logger());
    }

    std::shared_ptr<pg::pool> pool_for(pg::config cfg) {
        pg::pool_options o;
        o.server = std::move(cfg);
        o.size = 4;
        o.server.connect_timeout = std::chrono::seconds(2);
        return pg::pool::create(io.get_executor(), pool.get_executor(), std::move(o), logger());
    }

    // Short delays so requeue verdicts are easy to compare; the lease is long unless a test shortens it.
    billing::charge_flow_config config_for_pipeline() {
        using namespace std::chrono_literals;
        billing::charge_flow_config c;
        c.key_namespace = key_namespace;
        c.lease = 30s;
        c.lease_renew_interval = 5s;
        c.lease_held_delay = 101ms;
        c.retry_same_key_delay = 102ms;
        c.indeterminate_delay = 103ms;
        c.stripe_unavailable_delay = 104ms;
        c.new_key_quiet = 0ms;  // the quiet rule has its own tests
        c.postgres_backoff = {50ms, 400ms};
        c.now = [this] { return std::chrono::system_clock::now() + clock_offset; };
        return c;
    }

    std::unique_ptr<billing::charge_flow> make_pipeline(billing::charge_flow_config c,
                                                        metrics::registry* r = nullptr) {
        return std::make_unique<billing::charge_flow>(std::move(c), *ledger, *stripe, logger(), r);
    }
    std::unique_ptr<billing::charge_flow> make_pipeline() { return make_pipeline(config_for_pipeline()); }

    // One delivery through `p`, run on the test's io_context.
    billing::verdict handle(billing::charge_flow& p, billing::delivery d) {
        return run_async(io, [&]() { return p.handle(std::move(d)); });
    }

    // The "dead worker": a worker ran the pre-flight for `body` (row inserted pending, first Stripe attempt
    // recorded, leased for `lease`) and did nothing more. Returns the row it wrote.
    billing::ledger_record dead_workers_row(const std::string& body, const std::string& message_id,
                                            std::chrono::milliseconds lease) {
        auto ev = billing::parse_event(body);
        BOOST_TEST_REQUIRE(ev.has_value());
        billing::new_record nr{billing::base_key(key_namespace, ev->customer_id, ev->billing_period), *ev,
                               message_id, 1, key_namespace};
        auto pf = run(ledger->preflight(std::move(nr), lease));
        BOOST_TEST_REQUIRE(pf.has_value(), (pf ? "" : pf.err().describe()));
        BOOST_TEST_REQUIRE(pf->inserted);
        return std::move(pf->record);
    }

    std::optional<billing::ledger_record> row(const std::string& key) {
        auto r = run(ledger->find(key));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        return *r;
    }

    // A single int8 from SQL (counts), with text parameters.
    template <typename... A>
    std::int64_t scalar(const std::string& sql, A... args) {
        auto r = run(query(sql, pg::params(args...)));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        return (*r)[0].template get<std::int64_t>(0);
    }

    net::awaitable<result<pg::rows>> query(std::string sql, pg::params p) {
        auto c = co_await pg->acquire();
        if (!c) co_return c.err();
        co_return co_await (*c)->query_with(sql, std::move(p), std::chrono::seconds(5));
    }

    // Moves the row's last sign of a Stripe call (last_stripe_attempt_at) 61 s into the past: older than
    // the 60 s quiet period the new-generation tests ask for.
    void age_last_attempt(const std::string& key) {
        auto r =
            run(query("UPDATE billing_records SET last_stripe_attempt_at = now() - interval '61 s' "
                      "WHERE key = $1",
                      pg::params(key)));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    }

    std::int64_t dead_letters(const std::string& message_id) {
        return scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = $1", message_id);
    }

    // Another worker taking a lease while this one's Stripe call is awaited: a touch function that, at its
    // second call (the first renewal after the call began), moves the lease epoch of `table`'s row `key`.
    // `*taken` is set once that statement has succeeded.
    billing::touch_fn take_lease_at_second_touch(std::string table, std::string key, bool* taken) {
        auto touches = std::make_shared<int>(0);
        return [this, touches, table = std::move(table), key = std::move(key), taken] {
            if (++*touches != 2) return;
            asio::co_spawn(
                io,
                [this, sql = "UPDATE " + table + " SET lease_epoch = lease_epoch + 1 WHERE key = $1", key,
                 taken]() -> net::awaitable<void> {
                    auto r = co_await query(sql, pg::params(key));
                    *taken = r.has_value();
                },
                asio::detached);
        };
    }
};

// The value of a metric family with one series (its first sample); -1 when it has none.
inline double first_sample(metrics::registry& reg, const std::string& family) {
    auto fams = test::parse_prometheus(reg.render());
    auto it = fams.find(family);
    return it == fams.end() || it->second.samples.empty() ? -1.0 : it->second.samples[0].value;
}

// Runs the pending-age monitor `m` (period ~20 ms) until `done()` holds, or for `periods` more periods after
// `started()` first held: it has no completion event of its own, so the test looks after each period.
template <typename Done, typename Started>
void watch_pending_age(billing_fixture& f, billing::pending_age_monitor& m, Done done, Started started,
                       int periods) {
    run_async(f.io, [&]() -> net::awaitable<void> {
        m.start(f.io.get_executor());
        net::steady_timer t(f.io);
        int after = 0;
        while (!done() && after < periods) {
            if (started()) ++after;
            t.expires_after(std::chrono::milliseconds(20));
            co_await t.async_wait();
        }
        co_await m.stop();
    });
}

// A verdict's reason as its wire name ("ok", "declined", …), for readable assertions.
inline std::string reason(const billing::verdict& v) {
    return std::string(billing::to_string(v.reason));
}

}  // namespace cg::test
