// fake-stripe on the test's io_context and stripe::client instances on an offload pool, shared by the
// Stripe integration tests. `io` is declared before `pool` so it outlives the pool's threads.
#pragma once

#include <asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "metrics/registry.hpp"
#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "support/test_certs.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

namespace cg::test {

struct fake_stripe_fixture {
    net::loop_pair loops{2};
    asio::io_context& io = loops.io;
    net::offload_pool& pool = loops.offload;
    std::unique_ptr<fake::fake_stripe> fake;
    std::uint16_t port = 0;
    metrics::registry reg;  // for clients created with &reg

    fake_stripe_fixture() {
        auto tls = net::make_tls_server_context({cert("server.pem"), cert("server.key")});
        BOOST_TEST_REQUIRE(tls.has_value());
        fake = std::make_unique<fake::fake_stripe>(io.get_executor(), *tls, logger());
        auto ep = fake->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        port = ep->port();
        fake->start();
    }
    // The handlers left on either loop go while the fake and the registry they may refer to exist.
    ~fake_stripe_fixture() { loops.shut_down(); }

    // Short timeouts and retry delays so the suite stays fast.
    stripe::client_config config() const {
        using namespace std::chrono_literals;
        stripe::client_config c;
        c.api_base = "https://127.0.0.1:" + std::to_string(port);
        c.api_key = "sk_test_chargeguard";
        c.ca_file = cert("ca.pem");
        c.request_timeout = 2s;
        c.connect_timeout = 1s;
        c.retry = {2, 10ms, 40ms};
        return c;
    }

    std::unique_ptr<stripe::client> client(stripe::client_config c, metrics::registry* r = nullptr) {
        auto cl = stripe::client::create(pool.get_executor(), std::move(c), logger(), r);
        BOOST_TEST_REQUIRE(cl.has_value());
        return std::move(*cl);
    }
    std::unique_ptr<stripe::client> client(metrics::registry* r) { return client(config(), r); }
    std::unique_ptr<stripe::client> client() { return client(config()); }
};

// Charges `req` into *out; the last of the `*left` concurrent callers cancels `done` (which its test awaits).
inline asio::awaitable<void> charge_into(stripe::client* c, stripe::charge_request req,
                                         stripe::charge_outcome* out, int* left, net::steady_timer* done) {
    *out = co_await c->create_charge(std::move(req));
    if (--*left == 0) done->cancel();
}

// A charge of `amount` cents to `customer` under the idempotency key `key` (also its billing_key).
inline stripe::charge_request charge_req(std::string key, std::string customer = "cus_ok",
                                         std::int64_t amount = 4200) {
    stripe::charge_request r;
    r.amount = amount;
    r.currency = "usd";
    r.customer = std::move(customer);
    r.description = "plan 2024-05";
    r.metadata = {{"billing_key", key}, {"customer_id", "c-1"}, {"billing_period", "2024-05"}};
    r.idempotency_key = std::move(key);
    return r;
}

inline std::string cls(stripe::outcome_class c) {
    return std::string(stripe::to_string(c));
}

}  // namespace cg::test
