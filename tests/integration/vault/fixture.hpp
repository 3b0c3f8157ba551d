// The vault proxy against real parts: a scratch PostgreSQL database with the migrations applied, an
// in-process fake-stripe over TLS as the upstream, the proxy behind a real http::server on loopback, and an
// http::client (on the offload pool) as the proxy's caller. The fake, the pool, the proxy and its server all
// run on the test's io_context; every log line goes to a memory sink the tests search for secrets.
#pragma once

#include <asio/co_spawn.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/client.hpp"
#include "http/server.hpp"
#include "net/timeout.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "stripe/json.hpp"
#include "support/run_async.hpp"
#include "tests/integration/pg/support.hpp"
#include "tests/integration/stripe/fake_fixture.hpp"
#include "vault/policy.hpp"
#include "vault/proxy.hpp"
#include "vault/secret.hpp"
#include "vault/store.hpp"

namespace cg::test {

inline const std::string real_key = "sk_test_vault_REAL_never_leaves";

template <typename T>
net::awaitable<std::optional<T>> boxed_v(net::awaitable<T> a) {
    co_return std::optional<T>(co_await std::move(a));
}

struct issued {
    std::string id;
    std::string secret;
};

struct vault_fixture : fake_stripe_fixture {
    scratch_db db{"vault"};
    std::shared_ptr<log_sink> sink_holder = std::make_shared<memory_sink>();
    memory_sink& sink = static_cast<memory_sink&>(*sink_holder);
    logger log{sink_holder, log_level::debug};
    std::shared_ptr<pg::pool> pg;
    std::unique_ptr<vault::store> store;
    metrics::registry vreg;
    std::unique_ptr<vault::proxy> proxy;
    std::unique_ptr<http::server> server;
    std::uint16_t proxy_port = 0;
    std::unique_ptr<http::client> caller;

    explicit vault_fixture(bool start_proxy = true) {
        pg = pool_for(db.config());
        auto migrated = run(migrate_now());
        BOOST_TEST_REQUIRE(migrated.has_value(), (migrated ? "" : migrated.err().describe()));
        store = std::make_unique<vault::store>(pg);
        if (start_proxy) start(proxy_config());
    }
    ~vault_fixture() {
        try {
            if (second) {
                second->server->stop();
                run_async(io, [&]() -> net::awaitable<void> { co_await second->proxy->stop(); });
                run_async(io, [&]() -> net::awaitable<void> { co_await second->pool->close(); });
            }
            if (server) server->stop();
            if (proxy) run_async(io, [&]() -> net::awaitable<void> { co_await proxy->stop(); });
            run_async(io, [&]() -> net::awaitable<void> { co_await pg->close(); });
        } catch (...) {
        }
    }

    template <typename T>
    T run(net::awaitable<T> a, std::chrono::seconds limit = std::chrono::seconds(60)) {
        return std::move(*run_async(
            io, [&]() { return boxed_v(std::move(a)); }, limit));
    }

    void run(net::awaitable<void> a, std::chrono::seconds limit = std::chrono::seconds(60)) {
        run_async(
            io, [&]() { return std::move(a); }, limit);
    }
    // Lets the loop run for `d` (the fake, the proxy's tasks) while the test waits for a condition.
    void pause(std::chrono::milliseconds d) { run(net::sleep_for(d)); }

    net::awaitable<result<pg::migrate_report>> migrate_now() {
        auto c = co_await pg->acquire();
        if (!c) co_return c.err();
        auto ms = pg::embedded_migrations();
        if (!ms) co_return ms.err();
        co_return co_await pg::migrate(**c, *ms, {}, logger());
    }

    std::shared_ptr<pg::pool> pool_for(pg::config cfg, std::size_t size = 8) {
        pg::pool_options o;
        o.server = std::move(cfg);
        o.size = size;
        // Generous: a connect is a round trip to the test's own server, which a loaded machine (or the
        // ThreadSanitizer tree) can hold up for seconds; no vault test waits on a connect that times out.
        o.server.connect_timeout = std::chrono::seconds(15);
        return pg::pool::create(io.get_executor(), pool.get_executor(), std::move(o), log);
    }

    // The proxy's connect timeout to fake-stripe (also bounds the upstream probe, which stop() waits for).
    std::chrono::milliseconds upstream_connect_timeout{1000};

    // Short timers; the resolver is driven by the tests (resolve_once), so its loop interval is long.
    vault::proxy_config proxy_config() const {
        using namespace std::chrono_literals;
        vault::proxy_config c;
        c.upstream = "https://127.0.0.1:" + std::to_string(port);
        c.upstream_key = real_key;
        c.ca_file = cert("ca.pem");
        c.request_timeout = 2s;
        c.connect_timeout = upstream_connect_timeout;
        c.max_connections = 64;
        c.resolve_interval = 1h;
        c.first_resolve_delay = 0ms;
        c.stale_reserved = 3s;
        c.gauge_interval = 100ms;
        c.upstream_probe_interval = 200ms;
        return c;
    }

    // (Re)creates the proxy and its listener (plain HTTP unless `tls`), and the caller's client.
    void start(vault::proxy_config c, std::shared_ptr<pg::pool> use_pool = nullptr,
               std::shared_ptr<asio::ssl::context> tls = nullptr) {
        auto p = vault::proxy::create(io.get_executor(), pool.get_executor(), std::move(c),
                                      use_pool ? use_pool : pg, log, vreg);
        BOOST_TEST_REQUIRE(p.has_value(), (p ? "" : p.err().describe()));
        proxy = std::move(*p);
        http::server_options so;
        so.tls = tls;
        so.limits.max_body_bytes = 1024 * 1024;
        server = std::make_unique<http::server>(io.get_executor(), proxy->routes(), std::move(so), log);
        auto ep = server->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        proxy_port = ep->port();
        server->start();
        proxy->start();
        http::client_options co;
        co.max_connections = 256;
        co.request_timeout = std::chrono::seconds(20);
        if (tls) {
            auto ctx = net::make_tls_client_context({cert("ca.pem")});
            BOOST_TEST_REQUIRE(ctx.has_value());
            co.tls = *ctx;
        }
        auto cl = http::client::create(
            pool.get_executor(),
            std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(proxy_port), std::move(co),
            logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        caller = std::move(*cl);
    }

    // A second, independent proxy instance on the same database (its own reservation batching, its own pool):
    // what two replicas of the sidecar look like. Returns a client that reaches it.
    struct replica {
        std::shared_ptr<pg::pool> pool;
        std::unique_ptr<vault::proxy> proxy;
        std::unique_ptr<http::server> server;
        std::unique_ptr<http::client> caller;
    };
    metrics::registry vreg2;
    std::unique_ptr<replica> second;
    http::client& start_second(std::optional<vault::proxy_config> c = std::nullopt) {
        second = std::make_unique<replica>();
        second->pool = pool_for(db.config());
        auto p = vault::proxy::create(io.get_executor(), pool.get_executor(), c ? *c : proxy_config(),
                                      second->pool, log, vreg2);
        BOOST_TEST_REQUIRE(p.has_value());
        second->proxy = std::move(*p);
        second->server = std::make_unique<http::server>(io.get_executor(), second->proxy->routes(),
                                                        http::server_options{}, log);
        auto ep = second->server->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        second->server->start();
        http::client_options co;
        co.max_connections = 256;
        auto cl = http::client::create(pool.get_executor(), "http://127.0.0.1:" + std::to_string(ep->port()),
                                       co, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        second->caller = std::move(*cl);
        return *second->caller;
    }

    issued issue(std::int64_t cap, std::string allow = std::string(vault::default_allow),
                 std::string currency = "usd") {
        auto s = vault::issue_secret();
        BOOST_TEST_REQUIRE(s.has_value());
        vault::new_key k;
        k.id = s->id;
        k.name = "test key";
        k.secret_hash = s->hash;
        k.billing_period = "2026-11";
        k.cap_cents = cap;
        k.currency = std::move(currency);
        k.allowed = *vault::parse_allow_list(allow);
        auto r = run(store->insert_key(k));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        return {s->id, s->secret};
    }

    static http::request post(const std::string& secret, std::string path, std::string body,
                              std::string idem) {
        http::request q;
        q.method = "POST";
        q.target = std::move(path);
        q.body = std::move(body);
        if (!secret.empty()) q.headers.add("Authorization", "Bearer " + secret);
        q.headers.add("Content-Type", "application/x-www-form-urlencoded");
        if (!idem.empty()) q.headers.add("Idempotency-Key", std::move(idem));
        return q;
    }
    static http::request get(const std::string& secret, std::string target) {
        http::request q;
        q.method = "GET";
        q.target = std::move(target);
        if (!secret.empty()) q.headers.add("Authorization", "Bearer " + secret);
        return q;
    }
    static std::string charge_body(std::int64_t amount, const std::string& customer = "cus_vault",
                                   const std::string& currency = "usd") {
        return "amount=" + std::to_string(amount) + "&currency=" + currency + "&customer=" + customer +
               "&description=vault+test&metadata[billing_key]=bk";
    }

    // A row as a proxy reserves it for a create (`body` as forwarded), left `reserved` or marked `uncertain`
    // (due for the resolver at once): what a forward that came to no definite answer leaves behind.
    void put_row(const std::string& key_id, const std::string& idem, std::int64_t amount, std::string path,
                 std::string body, std::string customer, bool uncertain = true) {
        vault::reserve_request r;
        r.key_id = key_id;
        r.idempotency_key = idem;
        r.amount_cents = amount;
        r.path = std::move(path);
        r.body = std::move(body);
        r.customer = std::move(customer);
        auto res = run(store->step(key_id, {}, {r}));
        BOOST_TEST_REQUIRE(res.has_value(), (res ? "" : res.err().describe()));
        BOOST_TEST_REQUIRE(res->at(0).owner());
        if (!uncertain) return;
        vault::settlement_request s;
        s.idempotency_key = idem;
        s.state = "uncertain";
        s.why = "test: no answer";
        auto u = run(store->step(key_id, {s}, {}));
        BOOST_TEST_REQUIRE(u.has_value(), (u ? "" : u.err().describe()));
    }
    // A Stripe client straight to fake-stripe with the real key: another caller of the same Stripe account.
    std::unique_ptr<stripe::client> direct_stripe() {
        auto c = config();
        c.api_key = real_key;
        return client(c);
    }

    // Sends one request through the proxy and returns the answer (transport failures fail the test).
    http::response send(http::request q) {
        auto r = run(caller->request(std::move(q)));
        BOOST_TEST_REQUIRE(r.ok(), r.err.describe());
        remember(r.resp);
        return std::move(r.resp);
    }

    // Sends every request at once and returns the answers in order.
    // `other`: odd requests go there (a second replica), even ones to the fixture's proxy.
    std::vector<http::response> send_all(std::vector<http::request> qs, http::client* other = nullptr) {
        struct shared {
            std::vector<http::response> out;
            std::size_t left;
            bool done = false;
        };
        auto st = std::make_shared<shared>();
        st->out.resize(qs.size());
        st->left = qs.size();
        for (std::size_t i = 0; i < qs.size(); ++i) {
            http::client* via = other && i % 2 ? other : caller.get();
            asio::co_spawn(io, one(via, std::move(qs[i])),
                           [st, i](std::exception_ptr e, http::client_result r) {
                               if (e || !r.ok()) r.resp.status = 0;
                               st->out[i] = std::move(r.resp);
                               if (--st->left == 0) st->done = true;
                           });
        }
        run_until_done(io, st->done, std::chrono::seconds(60));
        BOOST_TEST_REQUIRE(st->done);
        for (const auto& r : st->out) remember(r);
        return std::move(st->out);
    }
    static net::awaitable<http::client_result> one(http::client* c, http::request q) {
        co_return co_await c->request(std::move(q));
    }

    // Every answer a caller saw, to check that no secret ever left in one.
    std::vector<std::string> seen;
    void remember(const http::response& r) {
        std::string all = std::to_string(r.status) + "\n";
        for (const auto& [k, v] : r.headers) all += k + ": " + v + "\n";
        seen.push_back(all + r.body);
    }

    // Runs `sql` on the scratch database and returns the first column of the first row as text.
    std::string scalar(const std::string& sql) {
        auto r = run(query(sql));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        BOOST_TEST_REQUIRE(!r->empty(), sql);
        return std::string(r->text(0, 0));
    }
    net::awaitable<result<pg::rows>> query(std::string sql) {
        auto c = co_await pg->acquire();
        if (!c) co_return c.err();
        co_return co_await (*c)->query(sql);
    }
    std::int64_t count(const std::string& sql) { return std::stoll(scalar(sql)); }

    std::size_t fake_charges() {
        return run([](fake::fake_stripe* f) -> net::awaitable<std::size_t> {
            co_return f->charges().size();
        }(fake.get()));
    }
    std::vector<fake::intent_rec> fake_intents() {
        return run([](fake::fake_stripe* f) -> net::awaitable<std::vector<fake::intent_rec>> {
            co_return f->intents();
        }(fake.get()));
    }
    std::uint64_t fake_requests() {
        return run([](fake::fake_stripe* f) -> net::awaitable<std::uint64_t> {
            co_return f->requests();
        }(fake.get()));
    }
    void flush_audit() { BOOST_TEST_REQUIRE(run(proxy->flush_audit())); }
    // The proxy answers first and writes what the answer means for the reservation (settled, released,
    // uncertain) afterwards, with the key's next batch: wait for those writes (both replicas) before
    // looking at vault_spend.
    void settle_now() {
        BOOST_TEST_REQUIRE(run(proxy->flush_settlements()));
        if (second) BOOST_TEST_REQUIRE(run(second->proxy->flush_settlements()));
    }
};

// "state:stripe_object_id" of the vault_spend row of `idem`.
inline std::string row_of(vault_fixture& f, const std::string& idem) {
    return f.scalar(
        "SELECT state || ':' || coalesce(stripe_object_id, '') FROM vault_spend WHERE idempotency_key = '" +
        idem + "'");
}

// The `error` object of a Stripe-shaped answer (a refusal of the proxy's own, or Stripe's relayed): its code
// and its type.
inline std::string error_code_of(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return e ? e->code : "(no error object)";
}
inline std::string error_type_of(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return e ? e->type : "(no error object)";
}

}  // namespace cg::test
