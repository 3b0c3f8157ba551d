// A Stripe call waiting for the client's rate limit (issue 12 §2) is a slow Stripe call like any other: the
// pipeline keeps TOUCHing the message and renewing its lease while it waits, so a redelivery elsewhere sees
// "lease held" and nothing is charged twice. Real PostgreSQL, fake-stripe over TLS, the real client with
// --stripe-max-rps 1. g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "fixture.hpp"
#include "net/timeout.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::key_of;
using cg::test::run_async;

namespace {

net::awaitable<void> handle_into(billing::charge_flow* p, billing::delivery d, billing::touch_fn touch,
                                 std::optional<billing::verdict>* out) {
    *out = co_await p->handle(std::move(d), std::move(touch));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_rate_wait)

// Three events at once through a client limited to one request every 2 s: the third waits ~4 s for its turn,
// far past the 1 s lease. Its lease is renewed and its message touched meanwhile; a redelivery of it handled
// by another instance at ≈ 1.4 s is requeued "lease held"; every event is charged once. (At 1 request/s the
// third call's turn came ~2 s after the first one's, and a preflight slowed by a loaded machine (ASan, CI)
// left it fewer than the 7 touches that start the redelivery: the test then waited for it in vain.)
BOOST_AUTO_TEST_CASE(lease_and_touch_are_kept_while_waiting_for_the_rate_limit) {
    test::billing_fixture f;
    auto sc = f.config();
    sc.request_timeout = 10s;
    sc.rate.max_rps = 0.5;
    sc.rate.adaptive = false;
    auto slow = f.client(sc);
    auto cfg = f.config_for_pipeline();
    cfg.lease = 1000ms;
    cfg.lease_renew_interval = 200ms;
    billing::charge_flow a(cfg, *f.ledger, *slow, logger());
    billing::charge_flow b(cfg, *f.ledger, *slow, logger());

    std::array<std::optional<billing::verdict>, 3> v;
    std::optional<billing::verdict> redelivered;
    std::array<int, 3> touches{};
    const std::string third = event_json("rate-2", "2026-11", 300);
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            for (int i = 0; i < 3; ++i) {
                billing::touch_fn touch = [&, i] {
                    if (++touches[i] == 7 && i == 2)  // ≈ 1.4 s: the third call is still waiting its turn
                        asio::co_spawn(ex, handle_into(&b, delivery_of(third, "2b03", 2), {}, &redelivered),
                                       asio::detached);
                };
                auto body = event_json("rate-" + std::to_string(i), "2026-11", 100 * (i + 1));
                asio::co_spawn(
                    ex, handle_into(&a, delivery_of(body, "2b0" + std::to_string(i + 1)), touch, &v[i]),
                    asio::detached);
                co_await net::sleep_for(20ms);  // in this order through the limiter
            }
            while (!v[0] || !v[1] || !v[2] || !redelivered) co_await net::sleep_for(10ms);
        },
        30s);
    for (int i = 0; i < 3; ++i) {
        BOOST_TEST_CONTEXT("event " << i) {
            BOOST_TEST(std::string(billing::to_string(v[i]->reason)) == "charged", v[i]->detail);
            BOOST_TEST(f.fake->posts_for(key_of("rate-" + std::to_string(i), "2026-11")) == 1);
        }
    }
    BOOST_TEST(touches[2] >= 7);  // touched all through the wait
    BOOST_TEST(std::string(billing::to_string(redelivered->reason)) == "requeued_lease_held",
               redelivered->detail);
    BOOST_TEST(f.fake->charges().size() == 3u);
    BOOST_TEST(f.row(key_of("rate-2", "2026-11"))->stripe_attempts == 1);
}

BOOST_AUTO_TEST_SUITE_END()
