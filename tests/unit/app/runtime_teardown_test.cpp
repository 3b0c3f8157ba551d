// The runtime's teardown: work abandoned on the main loop (a coroutine still suspended when the loop
// stops) is destroyed while the offload pool it may hand cleanup to still exists. A pooled PostgreSQL
// connection is such work: its destructor posts PQfinish to the offload pool.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <memory>

#include "app/runtime.hpp"

using namespace cg;

namespace {

// Counts once when destroyed, whether the handler holding it ran or was abandoned.
struct counts_when_gone {
    std::shared_ptr<std::atomic<int>> n;
    counts_when_gone(const counts_when_gone&) = delete;
    counts_when_gone(counts_when_gone&& o) noexcept : n(std::move(o.n)) {}
    explicit counts_when_gone(std::shared_ptr<std::atomic<int>> c) : n(std::move(c)) {}
    ~counts_when_gone() {
        if (n) ++*n;
    }
};

// Posts its cleanup to `offload` from its destructor, as pg::connection does.
struct posts_cleanup {
    asio::io_context::executor_type offload;
    std::shared_ptr<std::atomic<int>> cleaned;
    posts_cleanup(asio::io_context::executor_type ex, std::shared_ptr<std::atomic<int>> c)
        : offload(ex), cleaned(std::move(c)) {}
    posts_cleanup(const posts_cleanup&) = delete;
    ~posts_cleanup() {
        asio::post(offload, [g = counts_when_gone(cleaned)] {});
    }
};

asio::awaitable<void> wait_forever(std::shared_ptr<posts_cleanup> held) {
    asio::steady_timer t(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
    co_await t.async_wait(asio::use_awaitable);
    (void)held;
}

}  // namespace

BOOST_AUTO_TEST_CASE(abandoned_work_hands_its_cleanup_to_a_live_offload_pool) {
    constexpr int frames = 64;
    auto cleaned = std::make_shared<std::atomic<int>>(0);
    {
        app::runtime_options o;
        o.handle_signals = false;
        app::runtime rt(o, logger());
        for (int i = 0; i < frames; ++i)
            asio::co_spawn(
                rt.io(), wait_forever(std::make_shared<posts_cleanup>(rt.offload().get_executor(), cleaned)),
                asio::detached);
        rt.io().poll();  // every coroutine starts and suspends on its timer
        BOOST_TEST(cleaned->load() == 0);
    }
    // Each cleanup handler reached the pool and was run or destroyed with it; none was posted into a pool
    // already gone (ASan reports that as a use after free; without ASan the handler is never destroyed).
    BOOST_TEST(cleaned->load() == frames);
}
