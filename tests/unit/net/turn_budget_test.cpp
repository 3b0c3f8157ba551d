#include "net/turn_budget.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <vector>

#include "support/busy_for.hpp"

using namespace cg;
using cg::test::busy_for;
using namespace std::chrono_literals;

namespace {
struct burst {
    std::vector<int> order;
    int done = 0;
    int done_when_timer_ran = -1;
};

// One delivery's step: asks the budget, as the consumer, the group commit and the pipeline do, then works.
asio::awaitable<void> step(net::turn_budget& b, burst& st, int i) {
    if (b.spent()) co_await b.next_turn();
    busy_for(200us);
    st.order.push_back(i);
    ++st.done;
}

// 100 steps of 200 µs become ready in one handler, with a timer already due: how many ran before the timer?
burst run_burst(std::chrono::microseconds budget) {
    asio::io_context io;
    auto& b = net::turn_budget::of(io.get_executor());
    b.set(budget);
    burst st;
    net::steady_timer timer(io);
    asio::post(io, [&] {
        timer.expires_after(0ms);
        timer.async_wait([&](std::error_code) { st.done_when_timer_ran = st.done; });
        for (int i = 0; i < 100; ++i)
            asio::co_spawn(io, step(b, st, i), [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
    });
    io.run_for(10s);
    return st;
}
}  // namespace

BOOST_AUTO_TEST_CASE(off_unless_set) {
    asio::io_context io;
    auto& b = net::turn_budget::of(io.get_executor());
    BOOST_TEST(b.budget().count() == 0);
    busy_for(2ms);
    BOOST_TEST(!b.spent());
    BOOST_TEST(&net::turn_budget::of(io.get_executor()) == &b);  // one per io_context
    asio::io_context other;
    BOOST_TEST(&net::turn_budget::of(other.get_executor()) != &b);
}

BOOST_AUTO_TEST_CASE(without_a_budget_a_burst_runs_in_one_turn) {
    auto st = run_burst(0us);
    BOOST_TEST(st.done == 100);
    BOOST_TEST(st.done_when_timer_ran == 100);  // the due timer waited for all 20 ms of them
}

BOOST_AUTO_TEST_CASE(a_budget_lets_a_due_timer_in_and_keeps_every_step_in_order) {
    // 2 ms: about 10 steps a turn. The inline ones and one drained turn run before the timer; a slow or
    // preempted machine only makes a turn hold fewer steps.
    auto st = run_burst(2000us);
    BOOST_TEST(st.done == 100);
    BOOST_TEST(st.done_when_timer_ran >= 1);
    BOOST_TEST(st.done_when_timer_ran < 50);
    std::vector<int> expected;
    for (int i = 0; i < 100; ++i) expected.push_back(i);
    BOOST_TEST(st.order == expected, boost::test_tools::per_element());
}

namespace {
struct destroyed_flag {
    bool& flag;
    ~destroyed_flag() { flag = true; }
};
asio::awaitable<void> waits_a_turn(net::turn_budget& b, bool& destroyed, bool& resumed) {
    destroyed_flag guard{destroyed};
    co_await b.next_turn();
    resumed = true;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_step_still_waiting_is_destroyed_with_the_loop) {
    bool destroyed = false, resumed = false;
    {
        asio::io_context io;
        auto& b = net::turn_budget::of(io.get_executor());
        b.set(1ms);
        asio::co_spawn(io, waits_a_turn(b, destroyed, resumed), [](std::exception_ptr) {});
        io.run_one();  // starts the coroutine, which queues itself; the drain is posted but never runs
        BOOST_TEST(b.waiting() == 1u);
        BOOST_TEST(b.deferred() == 1u);
        BOOST_TEST(!destroyed);
    }
    BOOST_TEST(destroyed);  // its frame went with the io_context (ASan would see a leak otherwise)
    BOOST_TEST(!resumed);
}
