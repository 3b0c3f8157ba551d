// stripe::client ↔ fake-stripe over TLS when the transport fails (fake_fixture.hpp): a 500 after the create,
// a stall past the timeout, a connection dropped after the create, an unreachable origin and a wrong CA —
// each classified as the retry rules need, the key later replaying the original.
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

BOOST_AUTO_TEST_CASE(server_error_after_create_is_indeterminate_and_replayed) {
    fixture f;
    f.fake->faults().fail_after_create = 1;
    auto c = f.client();
    auto [first, again] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            auto a = co_await c->create_charge(charge_req("500-1"));
            auto b = co_await c->create_charge(charge_req("500-1"));
            co_return std::pair(a, b);
        });
    BOOST_TEST(cls(first.cls) == "indeterminate");
    BOOST_TEST(first.http_status == 500);
    BOOST_TEST(first.attempts == 1u);  // never hammered
    BOOST_TEST(cls(again.cls) == "indeterminate");
    BOOST_TEST(again.replayed);  // Stripe saved the 500
    BOOST_TEST(f.fake->charges().size() == 1u);
    // The charge exists: recovery finds it through the list.
    auto found_id = run_async(f.io, [&]() -> asio::awaitable<std::string> {
        auto found = co_await c->find_charge_by_billing_key("cus_ok", "500-1", std::nullopt);
        co_return found && found->has_value() ? (*found)->id : std::string("<none>");
    });
    BOOST_TEST(found_id == f.fake->charges()[0].id);
}

BOOST_AUTO_TEST_CASE(stall_times_out_as_indeterminate_and_the_key_later_replays) {
    fixture f;
    auto cfg = f.config();
    // The timeout covers a TLS handshake (the retries below open new connections): leave room for a
    // slow machine, and stall well past it.
    cfg.request_timeout = 500ms;
    cfg.retry = {12, 100ms, 400ms};
    auto c = f.client(cfg);
    auto [first, later] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            // Warm the pool so the stalled request is sent at once (the timeout then surely falls after it).
            auto warm = co_await c->create_charge(charge_req("warm-up"));
            BOOST_TEST(cls(warm.cls) == "succeeded");
            f.fake->faults().stall_ms = 1500;
            f.fake->faults().stall_count = 1;
            auto a = co_await c->create_charge(charge_req("stall-1"));
            // Same key again: 409 while the stalled request still executes, then the replay.
            auto b = co_await c->create_charge(charge_req("stall-1"));
            co_return std::pair(a, b);
        });
    BOOST_TEST(cls(first.cls) == "indeterminate");
    BOOST_TEST(first.http_status == 0);
    BOOST_TEST(first.attempts == 1u);
    BOOST_TEST(first.message.find("timeout") != std::string::npos, first.message);
    BOOST_TEST(cls(later.cls) == "succeeded", later.message);
    BOOST_TEST(later.replayed);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 2u);  // warm-up + the stalled one, never two of it
    BOOST_TEST(later.charge_id == f.fake->charges()[1].id);
}

BOOST_AUTO_TEST_CASE(dropped_connection_after_create_then_replay_returns_the_original) {
    fixture f;
    f.fake->faults().drop_after_create = 1;
    auto c = f.client();
    auto [first, again] =
        run_async(f.io, [&]() -> asio::awaitable<std::pair<stripe::charge_outcome, stripe::charge_outcome>> {
            auto a = co_await c->create_charge(charge_req("drop-1"));
            auto b = co_await c->create_charge(charge_req("drop-1"));
            co_return std::pair(a, b);
        });
    BOOST_TEST(cls(first.cls) == "indeterminate");
    BOOST_TEST(first.attempts == 1u);
    BOOST_TEST(cls(again.cls) == "succeeded");
    BOOST_TEST(again.replayed);
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);
    BOOST_TEST(again.charge_id == f.fake->charges()[0].id);
}

BOOST_AUTO_TEST_CASE(unreachable_before_sending_is_retry_same_key) {
    fixture f;
    auto cfg = f.config();
    {
        net::tcp_acceptor a(f.io, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        cfg.api_base = "https://127.0.0.1:" + std::to_string(a.local_endpoint().port());
    }
    auto c = f.client(cfg);
    auto o = run_async(f.io, [&]() { return c->create_charge(charge_req("nc-1")); });
    BOOST_TEST(cls(o.cls) == "retry_same_key");
    BOOST_TEST(o.attempts == 3u);
    BOOST_TEST(o.message.find("before sending") != std::string::npos, o.message);
}

BOOST_AUTO_TEST_CASE(wrong_ca_is_a_clear_error_and_not_retried) {
    fixture f;
    auto cfg = f.config();
    cfg.ca_file = cert("other-ca.pem");
    auto c = f.client(cfg);
    auto o = run_async(f.io, [&]() { return c->create_charge(charge_req("ca-1")); });
    BOOST_TEST(cls(o.cls) == "retry_same_key");  // nothing was sent
    BOOST_TEST(o.attempts == 1u);
    BOOST_TEST(o.message.find("certificate verify failed") != std::string::npos, o.message);
    BOOST_TEST(f.fake->requests() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
