#include "net/admission.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "net/offload.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {
struct admitted_order {
    std::vector<int> entered;  // order of admission
    std::vector<net::admission::ticket> held;
};

asio::awaitable<void> take(net::admission& a, admitted_order& t, int i) {
    auto turn = co_await a.enter();
    t.entered.push_back(i);
    t.held.push_back(std::move(turn));
}

void spawn_checked(asio::io_context& io, asio::awaitable<void> a) {
    asio::co_spawn(io, std::move(a), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
}
}  // namespace

// Up to capacity enter at once; the others wait, and each ticket dropped admits the oldest waiter.
BOOST_AUTO_TEST_CASE(admits_capacity_then_oldest_first) {
    asio::io_context io;
    net::admission a(2);
    admitted_order t;
    for (int i = 0; i < 5; ++i) spawn_checked(io, take(a, t, i));
    io.run_for(1s);
    io.restart();
    BOOST_TEST((t.entered == std::vector<int>{0, 1}));
    BOOST_TEST(a.held() == 2u);
    BOOST_TEST(a.waiting() == 3u);

    t.held.erase(t.held.begin());  // drops 0's ticket: 2 is admitted, not a newcomer
    spawn_checked(io, take(a, t, 5));
    io.run_for(200ms);
    io.restart();
    BOOST_TEST((t.entered == std::vector<int>{0, 1, 2}));
    BOOST_TEST(a.held() == 2u);

    t.held.clear();  // two places free: 3 and 4 enter, then 5
    io.run_for(200ms);
    io.restart();
    BOOST_TEST((t.entered == std::vector<int>{0, 1, 2, 3, 4}));
    t.held.clear();
    io.run_for(200ms);
    BOOST_TEST((t.entered == std::vector<int>{0, 1, 2, 3, 4, 5}));
    t.held.clear();
    BOOST_TEST(a.held() == 0u);
    BOOST_TEST(a.waiting() == 0u);
}

// A ticket moved keeps its place; a default ticket holds none.
BOOST_AUTO_TEST_CASE(ticket_moves_and_releases_once) {
    asio::io_context io;
    net::admission a(1);
    admitted_order t;
    spawn_checked(io, take(a, t, 0));
    io.run_for(200ms);
    io.restart();
    BOOST_TEST(a.held() == 1u);
    net::admission::ticket moved = std::move(t.held.front());
    t.held.clear();
    BOOST_TEST(a.held() == 1u);
    BOOST_TEST(moved.held());
    moved = net::admission::ticket();
    BOOST_TEST(a.held() == 0u);
    BOOST_TEST(!net::admission::ticket().held());
}

// A waiter on one executor is resumed on that executor's thread when a ticket is dropped on another thread.
namespace {
asio::awaitable<void> note_thread(net::admission& a, std::vector<std::thread::id>& resumed_on) {
    auto turn = co_await a.enter();
    resumed_on.push_back(std::this_thread::get_id());
}
}  // namespace

BOOST_AUTO_TEST_CASE(release_from_another_thread_resumes_on_the_waiters_executor) {
    asio::io_context io;
    net::offload_pool pool(1);
    net::admission a(1);
    // Held on the pool's thread.
    std::promise<net::admission::ticket> got;
    asio::co_spawn(pool.get_executor(), a.enter(),
                   [&got](std::exception_ptr, net::admission::ticket tk) { got.set_value(std::move(tk)); });
    auto first = got.get_future().get();
    BOOST_TEST(a.held() == 1u);
    std::vector<std::thread::id> resumed_on;
    spawn_checked(io, note_thread(a, resumed_on));
    io.run_for(100ms);
    io.restart();
    BOOST_TEST(resumed_on.empty());
    BOOST_TEST(a.waiting() == 1u);
    // Dropped on the pool's thread: the waiter resumes on io's (this) thread.
    std::promise<void> dropped;
    asio::post(pool.get_executor(), [&first, &dropped] {
        first.release();
        dropped.set_value();
    });
    dropped.get_future().wait();
    io.run_for(1s);
    BOOST_REQUIRE(resumed_on.size() == 1u);
    BOOST_TEST((resumed_on.front() == std::this_thread::get_id()));
    BOOST_TEST(a.held() == 0u);
}
