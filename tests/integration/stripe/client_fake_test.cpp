// stripe::client ↔ fake-stripe over TLS, one test per outcome class and per failure the issue names.
// The fake runs on the test's io_context (main thread); the client on an offload pool, as in production.
// Here the answers Stripe gives and the client's retries and bounds; failures of the transport are
// client_fake_failures_test.cpp, PaymentIntents, lists and old keys client_fake_reads_test.cpp.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <thread>
#include <vector>

#include "fake_fixture.hpp"
#include "http/server.hpp"
#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "stripe/error.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::cert;
using cg::test::charge_into;
using cg::test::charge_req;
using cg::test::cls;
using cg::test::run_async;
using stripe::outcome_class;

namespace {

using fixture = test::fake_stripe_fixture;

}  // namespace

BOOST_AUTO_TEST_SUITE(client_fake)

BOOST_AUTO_TEST_CASE(succeeded_then_replayed_with_the_same_id) {
    fixture f;
    auto c = f.client();
    auto main_thread = std::this_thread::get_id();
    auto [a, b] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            auto first = co_await c->create_charge(charge_req("key-1"));
            BOOST_TEST((std::this_thread::get_id() == main_thread));  // resumed on the caller's executor
            auto second = co_await c->create_charge(charge_req("key-1"));
            co_return std::pair(first, second);
        });
    BOOST_TEST(cls(a.cls) == "succeeded", a.message);
    BOOST_TEST(a.charge_id.starts_with("ch_"));
    BOOST_TEST(a.http_status == 200);
    BOOST_TEST(!a.replayed);
    BOOST_TEST(a.request_id.starts_with("req_"));
    BOOST_TEST(a.attempts == 1u);
    BOOST_TEST_REQUIRE(a.charge.has_value());
    BOOST_TEST(a.charge->amount == 4200);
    BOOST_TEST(stripe::metadata_value(a.charge->metadata, "billing_key").value_or("") == "key-1");

    BOOST_TEST(cls(b.cls) == "succeeded");
    BOOST_TEST(b.replayed);
    BOOST_TEST(b.charge_id == a.charge_id);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for("key-1") == 2);
}

BOOST_AUTO_TEST_CASE(keep_alive_one_handshake_for_many_charges) {
    fixture f;
    auto c = f.client();
    int ok = run_async(f.io, [&]() -> asio::awaitable<int> {
        int n = 0;
        for (int i = 0; i < 25; ++i) {
            auto o = co_await c->create_charge(charge_req("ka-" + std::to_string(i)));
            n += o.cls == outcome_class::succeeded;
        }
        co_return n;
    });
    BOOST_TEST(ok == 25);
    BOOST_TEST(c->http_stats().handshakes == 1u);
    BOOST_TEST(f.fake->charges().size() == 25u);
}

BOOST_AUTO_TEST_CASE(declined_card_and_authentication_required) {
    fixture f;
    f.fake->decline("cus_broke", {"card_declined", "insufficient_funds"});
    f.fake->decline("cus_3ds", {"authentication_required", ""});
    auto c = f.client();
    auto [d, pi] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            auto a = co_await c->create_charge(charge_req("dec-1", "cus_broke"));
            stripe::payment_intent_request p;
            p.amount = 900;
            p.currency = "eur";
            p.customer = "cus_3ds";
            p.payment_method = "pm_card_visa";
            p.idempotency_key = "dec-2";
            auto b = co_await c->create_payment_intent(p);
            co_return std::pair(a, b);
        });
    BOOST_TEST(cls(d.cls) == "declined");
    BOOST_TEST(d.http_status == 402);
    BOOST_TEST(d.error.type == "card_error");
    BOOST_TEST(d.error.decline_code == "insufficient_funds");
    BOOST_TEST(d.charge_id.starts_with("ch_"));  // the failed charge
    BOOST_TEST(d.attempts == 1u);
    BOOST_TEST(cls(pi.cls) == "declined");
    BOOST_TEST(pi.error.code == "authentication_required");
    BOOST_TEST(pi.payment_intent_id.starts_with("pi_"));
}

BOOST_AUTO_TEST_CASE(idempotency_conflict_on_changed_parameters) {
    fixture f;
    auto c = f.client();
    auto o = run_async(f.io, [&]() -> asio::awaitable<stripe::charge_outcome> {
        auto first = co_await c->create_charge(charge_req("same-key", "cus_ok", 100));
        BOOST_TEST(cls(first.cls) == "succeeded");
        co_return co_await c->create_charge(charge_req("same-key", "cus_ok", 200));
    });
    BOOST_TEST(cls(o.cls) == "idempotency_conflict");
    BOOST_TEST(o.http_status == 400);
    BOOST_TEST(o.attempts == 1u);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_bad_key_is_a_setup_error_and_bad_input_is_rejected) {
    fixture f;
    auto cfg = f.config();
    cfg.api_key = "pk_test_wrong_kind";
    auto bad_key = f.client(cfg);
    auto c = f.client();
    auto [auth, invalid] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            auto a = co_await bad_key->create_charge(charge_req("rej-1"));
            auto r = charge_req("rej-2");
            r.currency = "US";
            auto b = co_await c->create_charge(r);
            co_return std::pair(a, b);
        });
    // A bad key is our setup, not the request: the billing pipeline keeps such an event pending.
    BOOST_TEST(cls(auth.cls) == "setup_error");
    BOOST_TEST(auth.http_status == 401);
    BOOST_TEST(auth.message.find("Invalid API Key") != std::string::npos, auth.message);
    BOOST_TEST(cls(invalid.cls) == "rejected");
    BOOST_TEST(invalid.error.param == "currency");
    BOOST_TEST(f.fake->charges().empty());
}

BOOST_AUTO_TEST_CASE(cap_exceeded_from_a_vault_like_upstream) {
    // fake-stripe has no spend caps (the vault proxy adds them); a stub server answers as the proxy does.
    asio::io_context io{1};
    net::offload_pool pool{1};
    auto tls = net::make_tls_server_context({cert("server.pem"), cert("server.key")});
    BOOST_TEST_REQUIRE(tls.has_value());
    http::router r;
    r.add("POST", "/v1/charges", [](http::request&) -> asio::awaitable<http::response> {
        auto resp = http::make_response(
            402,
            R"({"error":{"type":"invalid_request_error","code":"spend_cap_exceeded","message":"cap of 5000 usd for 2024-05 reached"}})",
            "application/json");
        co_return resp;
    });
    http::server_options so;
    so.tls = *tls;
    http::server srv(io.get_executor(), r, so, logger());
    auto ep = srv.listen({"127.0.0.1", 0});
    BOOST_TEST_REQUIRE(ep.has_value());
    srv.start();
    stripe::client_config cfg;
    cfg.api_base = "https://127.0.0.1:" + std::to_string(ep->port());
    cfg.api_key = "vk_test_vault";
    cfg.ca_file = cert("ca.pem");
    auto c = stripe::client::create(pool.get_executor(), cfg, logger());
    BOOST_TEST_REQUIRE(c.has_value());
    auto o = run_async(io, [&]() { return (*c)->create_charge(charge_req("cap-1")); });
    BOOST_TEST(cls(o.cls) == "cap_exceeded");
    BOOST_TEST(o.message.find("cap of 5000") != std::string::npos, o.message);
}

BOOST_AUTO_TEST_CASE(rate_limited_then_retried_with_the_same_key_into_one_charge) {
    fixture f;
    f.fake->faults().rate_limit = 2;
    auto c = f.client();
    auto o = run_async(f.io, [&]() { return c->create_charge(charge_req("rl-1")); });
    BOOST_TEST(cls(o.cls) == "succeeded", o.message);
    BOOST_TEST(o.attempts == 3u);
    BOOST_TEST(f.fake->posts_for("rl-1") == 3);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_CASE(rate_limit_outlasting_the_retries_is_retry_same_key) {
    fixture f;
    f.fake->faults().rate_limit = 10;
    auto c = f.client();
    auto o = run_async(f.io, [&]() { return c->create_charge(charge_req("rl-2")); });
    BOOST_TEST(cls(o.cls) == "retry_same_key");
    BOOST_TEST(o.http_status == 429);
    BOOST_TEST(o.attempts == 3u);  // 1 + max_retries
    BOOST_TEST(f.fake->charges().empty());
}

BOOST_AUTO_TEST_CASE(key_in_use_409_is_retried) {
    fixture f;
    f.fake->faults().in_use = 1;
    auto c = f.client();
    auto o = run_async(f.io, [&]() { return c->create_charge(charge_req("iu-1")); });
    BOOST_TEST(cls(o.cls) == "succeeded", o.message);
    BOOST_TEST(o.attempts == 2u);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_CASE(concurrent_same_key_gets_409_then_the_replayed_charge) {
    fixture f;
    f.fake->faults().latency_ms = 200;
    auto cfg = f.config();
    cfg.retry = {3, 150ms, 300ms};
    auto c = f.client(cfg);
    stripe::charge_outcome a, b;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        int left = 2;
        net::steady_timer done(f.io, net::steady_timer::time_point::max());
        asio::co_spawn(f.io, charge_into(c.get(), charge_req("dup"), &a, &left, &done), asio::detached);
        asio::co_spawn(f.io, charge_into(c.get(), charge_req("dup"), &b, &left, &done), asio::detached);
        co_await done.async_wait();
    });
    BOOST_TEST(cls(a.cls) == "succeeded", a.message);
    BOOST_TEST(cls(b.cls) == "succeeded", b.message);
    BOOST_TEST(a.charge_id == b.charge_id);
    BOOST_TEST(a.replayed != b.replayed);       // exactly one of them saw the original
    BOOST_TEST(a.attempts + b.attempts >= 3u);  // the loser met a 409 first
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// max_calls bounds the calls under way: the callers past it wait at the client's entry, so the pool never
// needs more connections than that, however many callers there are (without the bound, each of the six
// concurrent calls would open a connection of its own: the pool may hold eight).
BOOST_AUTO_TEST_CASE(max_calls_bounds_the_calls_under_way_and_the_rest_wait_their_turn) {
    fixture f;
    f.fake->faults().latency_ms = 100;
    auto cfg = f.config();
    cfg.max_connections = 8;
    cfg.max_calls = 2;
    auto c = f.client(cfg);
    std::vector<stripe::charge_outcome> out(6);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        int left = static_cast<int>(out.size());
        net::steady_timer done(f.io, net::steady_timer::time_point::max());
        for (std::size_t i = 0; i < out.size(); ++i)
            asio::co_spawn(f.io,
                           charge_into(c.get(), charge_req("mc-" + std::to_string(i)), &out[i], &left, &done),
                           asio::detached);
        co_await done.async_wait();
    });
    for (const auto& o : out) BOOST_TEST(cls(o.cls) == "succeeded", o.message);
    BOOST_TEST(f.fake->charges().size() == 6u);
    BOOST_TEST(c->http_stats().connects <= 2u);
    BOOST_TEST(c->http_stats().requests == 6u);
}

// A call's turn may be dropped after its client is gone (in `consume`, a coroutine frame destroyed with the
// main loop at exit, after the Stripe client): dropping it touches nothing of the client (before, it locked
// the freed admission's mutex: an abort at exit, or a use-after-free under ASan), and a client made after it
// is unaffected.
BOOST_AUTO_TEST_CASE(a_turn_dropped_after_its_client_is_gone_is_harmless) {
    fixture f;
    auto cfg = f.config();
    cfg.max_calls = 1;
    auto c = f.client(cfg);
    auto turn = run_async(
        f.io, [&]() -> asio::awaitable<stripe::client::call_turn> { co_return co_await c->turn(); });
    BOOST_TEST_REQUIRE(turn.held());
    c.reset();
    turn.release();
    BOOST_TEST(!turn.held());
    auto again = f.client(cfg);
    auto o = run_async(f.io, [&]() { return again->create_charge(charge_req("after-1")); });
    BOOST_TEST(cls(o.cls) == "succeeded", o.message);
}

BOOST_AUTO_TEST_SUITE_END()
