// Stripe limits each account on its own, a Connect platform's connected accounts included: the client keeps
// one rate control per Stripe-Account beside the platform's, so a 429 storm on one connected account does
// not hold back another. Against fake-stripe's per-account limiter over real TLS. g++ 12 -O2 false positive
// on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <boost/test/unit_test.hpp>

#include "fake_fixture.hpp"
#include "net/timeout.hpp"
#include "support/run_async.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::run_async;

namespace {

struct account_tally {
    int done = 0, succeeded = 0;
};

net::awaitable<void> charge_in(stripe::client* c, std::string account, std::string key, account_tally* t) {
    auto r = test::charge_req(std::move(key), "cus_rate", 100);
    r.stripe_account = std::move(account);
    auto out = co_await c->create_charge(std::move(r));
    t->succeeded += out.cls == stripe::outcome_class::succeeded;
    ++t->done;
}

void spawn_charges(asio::any_io_executor ex, stripe::client* c, const std::string& account, int n,
                   account_tally* t) {
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ex, charge_in(c, account, account + "-" + std::to_string(i), t),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stripe_connect_rate)

// Account A is flooded past its limit (5/s) and draws 429s; its rate control drops and queues A's requests.
// B's requests, sent while A's queue is long, wait on B's own rate control: they all pass, none is refused,
// and they finish while A's are still queued. With one rate control for every account they would queue
// behind A's at A's lowered rate.
BOOST_AUTO_TEST_CASE(a_429_storm_on_one_account_does_not_slow_another) {
    test::fake_stripe_fixture f;
    const std::string a = "acct_1RateA", b = "acct_1RateB";
    f.fake->add_account(a, {"cus_rate"});
    f.fake->add_account(b, {"cus_rate"});
    f.fake->set_limits({5, 0, 1, 0});  // each account: 5 requests/s, 1 s deep
    auto cfg = f.config();
    cfg.rate.adaptive = true;
    cfg.rate.initial_rps = 10;
    cfg.retry.max_rate_limited_retries = 20;
    cfg.retry.max_delay = 200ms;
    cfg.request_timeout = 20s;
    auto c = f.client(cfg);
    constexpr int flood = 30, other = 5;
    account_tally ta, tb;
    int a_done_when_b_finished = -1;
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            spawn_charges(ex, c.get(), a, flood, &ta);
            // Wait for A's storm to hit Stripe's limit.
            while (!f.fake->account_limiter(a) || f.fake->account_limiter(a)->rate_limited() == 0)
                co_await net::sleep_for(5ms);
            spawn_charges(ex, c.get(), b, other, &tb);
            while (tb.done < other) co_await net::sleep_for(5ms);
            a_done_when_b_finished = ta.done;
            while (ta.done < flood) co_await net::sleep_for(5ms);
        },
        90s);
    BOOST_TEST(tb.succeeded == other);
    BOOST_TEST_REQUIRE(f.fake->account_limiter(b) != nullptr);
    BOOST_TEST(f.fake->account_limiter(b)->rate_limited() == 0u);
    BOOST_TEST(f.fake->account_limiter(a)->rate_limited() > 0u);
    BOOST_TEST(f.fake->limiter().rate_limited() == 0u);  // the platform's bucket was never touched
    BOOST_TEST(a_done_when_b_finished < flood - other, "A had finished " << a_done_when_b_finished);
}

BOOST_AUTO_TEST_SUITE_END()
