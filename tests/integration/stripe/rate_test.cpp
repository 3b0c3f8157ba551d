// Rate limits: fake-stripe's limiter (token buckets per endpoint and account, concurrency) and the client's
// rate control (--stripe-max-rps ceiling, AIMD) against it over real TLS sockets. g++ 12 -O2 false positive
// on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <boost/test/unit_test.hpp>

#include "fake_fixture.hpp"
#include "net/timeout.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/stripe/limiter.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::run_async;
using fake::limiter;
using stripe::outcome_class;

namespace {

using fixture = test::fake_stripe_fixture;

struct tally {
    int done = 0, succeeded = 0, other = 0;
    unsigned attempts = 0;
};

net::awaitable<void> one_charge(stripe::client* c, std::string key, tally* t) {
    stripe::charge_request r;
    r.amount = 100;
    r.currency = "usd";
    r.customer = "cus_rate";
    r.metadata = {{"billing_key", key}};
    r.idempotency_key = std::move(key);
    auto out = co_await c->create_charge(std::move(r));
    (out.cls == outcome_class::succeeded ? t->succeeded : t->other)++;
    t->attempts += out.attempts;
    ++t->done;
}

// `n` concurrent create-charge calls; returns when all are done, with the wall time they took.
std::chrono::duration<double> burst(fixture& f, stripe::client& c, int n, const std::string& prefix,
                                    tally& t) {
    auto start = std::chrono::steady_clock::now();
    run_async(
        f.io,
        [&]() -> net::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            for (int i = 0; i < n; ++i)
                asio::co_spawn(ex, one_charge(&c, prefix + std::to_string(i), &t), [](std::exception_ptr e) {
                    if (e) std::rethrow_exception(e);
                });
            while (t.done < n) co_await net::sleep_for(5ms);
        },
        60s);
    return std::chrono::steady_clock::now() - start;
}

double gauge(const fixture& f, const std::string& name) {
    auto fams = test::parse_prometheus(f.reg.render());
    auto it = fams.find(name);
    if (it == fams.end() || it->second.samples.empty()) return -1;
    return it->second.samples[0].value;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stripe_rate_limits)

BOOST_AUTO_TEST_CASE(endpoint_names_fold_object_ids) {
    BOOST_TEST(limiter::endpoint_of("POST", "/v1/charges") == "POST /v1/charges");
    BOOST_TEST(limiter::endpoint_of("GET", "/v1/charges/ch_123") == "GET /v1/charges/:id");
    BOOST_TEST(limiter::endpoint_of("GET", "/v1/payment_intents/pi_9") == "GET /v1/payment_intents/:id");
    BOOST_TEST(limiter::endpoint_of("GET", "/v1/charges/search") == "GET /v1/charges/search");
}

// The limiter alone, in simulated time: per-endpoint and account buckets, burst depth, concurrency.
BOOST_AUTO_TEST_CASE(limiter_table) {
    using v = limiter::verdict;
    const auto t0 = limiter::clock::time_point(std::chrono::seconds(100));
    limiter l;
    l.set({0, 10, 1, 0}, t0);  // 10/s per endpoint, 1 s deep
    int ok = 0;
    for (int i = 0; i < 30; ++i) ok += l.admit("POST /v1/charges", t0, 0) == v::ok;
    BOOST_TEST(ok == 10);                                               // the burst
    BOOST_TEST((l.admit("GET /v1/charges", t0, 0) == v::ok));           // another endpoint has its own bucket
    BOOST_TEST((l.admit("POST /v1/charges", t0 + 100ms, 0) == v::ok));  // one token per 100 ms
    BOOST_TEST((l.admit("POST /v1/charges", t0 + 150ms, 0) == v::rate_limited));
    BOOST_TEST(l.rate_limited() == 21u);

    limiter g;
    g.set({5, 0, 1, 0}, t0);  // account-wide 5/s
    ok = 0;
    for (int i = 0; i < 10; ++i)
        ok += g.admit(i % 2 ? "POST /v1/charges" : "GET /v1/charges", t0, 0) == v::ok;
    BOOST_TEST(ok == 5);
    ok = 0;
    for (int ms = 0; ms < 2000; ms += 10)
        ok += g.admit("GET /v1/charges", t0 + std::chrono::milliseconds(ms), 0) == v::ok;
    BOOST_TEST(ok >= 9);
    BOOST_TEST(ok <= 11);

    limiter c;
    c.set({0, 0, 1, 3}, t0);
    BOOST_TEST((c.admit("POST /v1/charges", t0, 2) == v::ok));
    BOOST_TEST((c.admit("POST /v1/charges", t0, 3) == v::too_concurrent));
    BOOST_TEST(c.too_concurrent() == 1u);
}

// Over the wire: a 429 from the limiter is Stripe's shape (invalid_request_error / rate_limit,
// Stripe-Should-Retry: true), and nothing is saved — the same key succeeds once the bucket refills.
BOOST_AUTO_TEST_CASE(limited_request_is_a_retryable_429_and_not_saved) {
    fixture f;
    f.fake->set_limits({0, 1, 1, 0});  // 1/s per endpoint
    auto cfg = f.config();
    cfg.retry.max_retries = 0;
    auto c = f.client(cfg);
    auto first = run_async(
        f.io, [&] { return c->call("POST", "/v1/charges", "amount=100&currency=usd&customer=cus_a", "k1"); });
    BOOST_TEST(first.http.resp.status == 200);
    auto second = run_async(
        f.io, [&] { return c->call("POST", "/v1/charges", "amount=100&currency=usd&customer=cus_a", "k2"); });
    BOOST_TEST(second.http.resp.status == 429);
    BOOST_TEST((second.cls == outcome_class::retry_same_key));
    BOOST_TEST_REQUIRE(second.error.has_value());
    BOOST_TEST(second.error->type == "invalid_request_error");
    BOOST_TEST(second.error->code == "rate_limit");
    BOOST_TEST(second.http.resp.headers.get("Stripe-Should-Retry").value_or("") == "true");
    BOOST_TEST(f.fake->posts_for("k2") == 0);  // refused before the endpoint ran
    BOOST_TEST(f.fake->charges().size() == 1u);
    // The same key later: a fresh request (no saved 429 replayed).
    run_async(f.io, []() -> net::awaitable<void> { co_await net::sleep_for(1100ms); });
    auto third = run_async(
        f.io, [&] { return c->call("POST", "/v1/charges", "amount=100&currency=usd&customer=cus_a", "k2"); });
    BOOST_TEST(third.http.resp.status == 200);
    BOOST_TEST(third.http.resp.headers.get("Idempotent-Replayed").value_or("") != "true");
}

// --stripe-max-rps: 40 concurrent calls with a 20/s ceiling take ≥ ~1.9 s and never meet the fake's 25/s
// endpoint limit; the waits are counted and the limit is exported.
BOOST_AUTO_TEST_CASE(ceiling_paces_below_the_endpoint_limit) {
    fixture f;
    f.fake->set_limits({0, 25, 0.2, 0});  // 25/s, 5 deep
    auto cfg = f.config();
    cfg.rate = {};
    cfg.rate.max_rps = 20;
    cfg.rate.adaptive = false;
    auto c = f.client(cfg, &f.reg);
    tally t;
    auto took = burst(f, *c, 40, "ceil-", t);
    BOOST_TEST(t.succeeded == 40);
    BOOST_TEST(f.fake->limiter().rate_limited() == 0u);
    BOOST_TEST(took.count() >= 1.9);  // 40 at 20/s, the first token at once
    BOOST_TEST(gauge(f, "chargeguard_stripe_rate_limit_rps") == 20.0);
    BOOST_TEST(gauge(f, "chargeguard_stripe_rate_limit_waits_total") >= 30.0);
}

// AIMD: no ceiling, 120 concurrent calls against a 30/s endpoint limit (5 deep). The first burst meets 429s
// (nothing is coordinated, the client starts unlimited); the client backs off from the rate Stripe accepted,
// every call succeeds (429s retried under the same key, paced), and it draws far fewer 429s than the same
// client without rate control, whose retries keep hitting the limit.
BOOST_AUTO_TEST_CASE(adaptive_limit_backs_off_on_429_and_every_call_succeeds) {
    auto run = [](bool adaptive, tally& t, double& limit) {
        fixture f;
        f.fake->set_limits({0, 30, 0.17, 0});
        auto cfg = f.config();
        cfg.rate = {};
        cfg.rate.adaptive = adaptive;
        cfg.retry.max_rate_limited_retries = 10;
        // Every 429 the fake sends must reach the client to be counted: on a loaded machine 120 requests
        // at once can take longer than the fixture's short timeout, and an answer read after the client
        // gave up is counted by the fake alone.
        cfg.request_timeout = 30s;
        auto c = f.client(cfg, &f.reg);
        burst(f, *c, 120, "aimd-", t);
        limit = gauge(f, "chargeguard_stripe_rate_limit_rps");
        BOOST_TEST(gauge(f, "chargeguard_stripe_throttled_total") ==
                   static_cast<double>(f.fake->limiter().rate_limited()));
        return f.fake->limiter().rate_limited();
    };
    tally paced, unpaced;
    double limit = 0, unpaced_limit = 0;
    auto throttled = run(true, paced, limit);
    auto unpaced_throttled = run(false, unpaced, unpaced_limit);
    BOOST_TEST_MESSAGE("429s: " << throttled << " with AIMD, " << unpaced_throttled << " without");
    BOOST_TEST(paced.succeeded == 120);
    BOOST_TEST(paced.other == 0);
    BOOST_TEST(throttled > 0u);  // the limit was really met
    BOOST_TEST(throttled * 2 < unpaced_throttled, throttled << " vs " << unpaced_throttled);
    BOOST_TEST(limit > 0.0);
    BOOST_TEST(limit < 40.0, "limit " << limit);
}

BOOST_AUTO_TEST_SUITE_END()
