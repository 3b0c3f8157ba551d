// Stress of the timeout and race primitive (net/timeout.hpp) on the shapes that break Asio 1.22's
// awaitable operators: a branch that completes on another thread, a branch that ends by exception, a
// timeout nested in another, thousands of times with the timeout and the operation's end close together.
// Meant for the sanitizer builds (ASan/UBSan, TSan), where a cancellation emitted into a dead handler or
// across threads is reported; the outcome checks hold in every build.
//
// CG_STRESS_OLD_PATTERN=1 runs the same scenarios through the old `op || timer` shape kept below, to show
// the failure on demand (docs/testing-sanitizers.md). CG_STRESS_ITERATIONS overrides the iteration count.
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace timeout_stress {

bool old_pattern() {
    const char* v = std::getenv("CG_STRESS_OLD_PATTERN");
    return v && std::string(v) == "1";
}

int iterations(int dflt) {
    const char* v = std::getenv("CG_STRESS_ITERATIONS");
    return v ? std::max(1, std::atoi(v)) : dflt;
}

// The old shape, kept only to reproduce the upstream bug: `op || timer` (a parallel_group with
// wait_for_one_success).
template <typename T>
asio::awaitable<std::optional<T>> old_with_timeout(asio::awaitable<T> op,
                                                   std::chrono::steady_clock::duration d) {
    using namespace asio::experimental::awaitable_operators;
    net::steady_timer timer(co_await asio::this_coro::executor, d);
    auto r = co_await (std::move(op) || timer.async_wait());
    if (r.index() == 0) co_return std::get<0>(std::move(r));
    co_return std::nullopt;
}

// Work that keeps arming and disarming cancellation slots: each zero-length timer wait installs a
// cancellation handler and its completion removes it, on whichever thread runs the executor.
asio::awaitable<int> churn(int steps) {
    net::steady_timer t(co_await asio::this_coro::executor);
    for (int i = 0; i < steps; ++i) {
        t.expires_after(std::chrono::microseconds(i % 3));
        auto [ec] = co_await t.async_wait();
        if (ec) co_return -1;  // cancelled
    }
    co_return steps;
}

asio::awaitable<int> churn_then_throw(int steps) {
    co_await churn(steps);
    throw std::runtime_error("branch failed");
}

struct tally {
    int done = 0, timed_out = 0, cancelled = 0, thrown = 0, other = 0;
    int total() const { return done + timed_out + cancelled + thrown + other; }
};

std::chrono::microseconds jitter(std::mt19937& rng, int max_us) {
    return std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_us)(rng));
}

// The operation finishes on the offload pool's threads while the timeout fires on the caller's.
asio::awaitable<void> cross_thread_one(net::offload_pool& pool, std::chrono::microseconds d, tally& t,
                                       int steps) {
    std::optional<int> r;
    if (old_pattern())
        r = co_await old_with_timeout(asio::co_spawn(pool.get_executor(), churn(steps), asio::use_awaitable),
                                      d);
    else
        r = co_await net::with_timeout(net::offload(pool.get_executor(), churn(steps)), d);
    if (!r)
        ++t.timed_out;
    else if (*r == steps)
        ++t.done;
    else if (*r == -1)
        ++t.cancelled;
    else
        ++t.other;
}

// The operation ends by exception, on the caller's executor, around the time the timeout fires.
asio::awaitable<void> exception_one(std::chrono::microseconds d, tally& t, int steps) {
    try {
        std::optional<int> r;
        if (old_pattern())
            r = co_await old_with_timeout(churn_then_throw(steps), d);
        else
            r = co_await net::with_timeout(churn_then_throw(steps), d);
        if (!r)
            ++t.timed_out;
        else
            ++t.other;  // churn_then_throw never returns a value
    } catch (const std::runtime_error&) {
        ++t.thrown;
    }
}

// A timeout inside another: the outer one's cancellation reaches the inner operation.
asio::awaitable<int> nested_inner(std::chrono::microseconds d, int steps) {
    // Half of the inner timeouts end before the outer one, half after.
    auto inner = steps % 2 ? d / 2 : d * 4;
    auto r = old_pattern() ? co_await old_with_timeout(churn(steps), inner)
                           : co_await net::with_timeout(churn(steps), inner);
    co_return r ? *r : -2;
}
asio::awaitable<void> nested_one(std::chrono::microseconds d, tally& t, int steps) {
    auto r = old_pattern() ? co_await old_with_timeout(nested_inner(d, steps), d)
                           : co_await net::with_timeout(nested_inner(d, steps), d);
    if (!r)
        ++t.timed_out;
    else if (*r == steps)
        ++t.done;
    else if (*r == -1 || *r == -2)
        ++t.cancelled;
    else
        ++t.other;
}

enum class scenario { cross_thread, exception, nested };

// `lanes` coroutines at once, `n` iterations in all; each lane runs its iterations one after another.
asio::awaitable<void> lane(scenario s, net::offload_pool* pool, int n, unsigned seed, tally* t) {
    std::mt19937 rng(seed);
    for (int i = 0; i < n; ++i) {
        // Timeouts about as long as the work, so that both ends meet: the cross-thread work is slower.
        auto d = jitter(rng, s == scenario::cross_thread ? 400 : 60);
        // Every eighth exception case ends long before its timeout: it must throw, whatever the load.
        if (s == scenario::exception && i % 8 == 0) d = old_pattern() ? 50ms : 60s;
        int steps = 1 + static_cast<int>(rng() % 40);
        switch (s) {
            case scenario::cross_thread:
                co_await cross_thread_one(*pool, d, *t, steps);
                break;
            case scenario::exception:
                co_await exception_one(d, *t, steps);
                break;
            case scenario::nested:
                co_await nested_one(d, *t, steps);
                break;
        }
    }
}

struct lanes_done {
    int left;
    net::steady_timer wake;
};
void lane_ended(lanes_done& ld) {
    if (--ld.left == 0) ld.wake.cancel();
}

asio::awaitable<tally> run_lanes(scenario s, net::offload_pool* pool, int total, int lanes) {
    tally t;
    lanes_done ld{lanes, net::steady_timer(co_await asio::this_coro::executor,
                                           std::chrono::steady_clock::time_point::max())};
    std::exception_ptr failure;
    for (int l = 0; l < lanes; ++l) {
        asio::co_spawn(co_await asio::this_coro::executor, lane(s, pool, total / lanes, 1234u + l, &t),
                       [&ld, &failure](std::exception_ptr e) {
                           if (e && !failure) failure = e;
                           lane_ended(ld);
                       });
    }
    while (ld.left > 0) co_await ld.wake.async_wait();
    if (failure) std::rethrow_exception(failure);
    co_return t;
}

constexpr int lane_count = 16;

}  // namespace timeout_stress

using namespace timeout_stress;

BOOST_AUTO_TEST_SUITE(timeout_stress)

// The old pattern's failure here is the one seen in the vault proxy: UBSan "member call on address …
// which does not point to an object of type 'cancellation_handler_base'" in cancellation_signal::emit.
BOOST_AUTO_TEST_CASE(operation_finishing_on_another_thread) {
    asio::io_context io;  // declared first: the pool's threads may still release work on it as they finish
    net::offload_pool pool(2);
    int n = iterations(4000) / lane_count * lane_count;
    auto t = test::run_async(
        io, [&] { return run_lanes(scenario::cross_thread, &pool, n, lane_count); }, 300s);
    BOOST_TEST_MESSAGE("cross-thread: " << t.done << " done, " << t.timed_out << " timed out, " << t.cancelled
                                        << " cancelled");
    BOOST_TEST(t.total() == n);
    BOOST_TEST(t.other == 0);
    // The hand-off does not forward the timeout's cancellation to the pool: the work always runs to its end.
    if (!old_pattern()) BOOST_TEST(t.cancelled == 0);
}

BOOST_AUTO_TEST_CASE(operation_ending_by_exception) {
    int n = iterations(4000) / lane_count * lane_count;
    auto t = test::run_async([&] { return run_lanes(scenario::exception, nullptr, n, lane_count); }, 300s);
    BOOST_TEST_MESSAGE("exception: " << t.thrown << " thrown, " << t.timed_out << " timed out");
    BOOST_TEST(t.total() == n);
    BOOST_TEST(t.other == 0);
    // The exception of a branch that ends before the timeout reaches the caller (the old `||` swallowed
    // it and waited out the timer instead): every eighth case has a timeout it cannot reach.
    BOOST_TEST(t.thrown >= n / lane_count / 8 * lane_count);
}

BOOST_AUTO_TEST_CASE(timeout_inside_a_timeout) {
    int n = iterations(4000) / lane_count * lane_count;
    auto t = test::run_async([&] { return run_lanes(scenario::nested, nullptr, n, lane_count); }, 300s);
    BOOST_TEST_MESSAGE("nested: " << t.done << " done, " << t.timed_out << " timed out, " << t.cancelled
                                  << " cancelled");
    BOOST_TEST(t.total() == n);
    BOOST_TEST(t.other == 0);
}

BOOST_AUTO_TEST_SUITE_END()
