#include "net/admission.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>
#include <string>
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

// A ticket may outlive its admission (a coroutine frame destroyed at shutdown after the Stripe client that
// owned the admission): dropping it then touches nothing freed (ASan reports it if it does; in a normal build
// it was a lock of a destroyed mutex that aborted `consume` at exit).
BOOST_AUTO_TEST_CASE(a_ticket_dropped_after_its_admission_is_harmless) {
    asio::io_context io;
    admitted_order t;
    {
        auto a = std::make_unique<net::admission>(1);
        spawn_checked(io, take(*a, t, 0));
        io.run_for(200ms);
        io.restart();
        BOOST_TEST_REQUIRE(t.held.size() == 1u);
        BOOST_TEST(a->held() == 1u);
        a.reset();
    }
    BOOST_TEST(t.held.front().held());
    t.held.clear();  // must not touch the admission
}

// The shapes stripe::client takes a ticket through (admit(), create_charge()): a wrapper that co_returns the
// awaited enter(), a defaulted by-value ticket parameter assigned from it inside an if, then a co_return of
// an awaited inner coroutine. The ticket here is won by waiting, the path whose initiation g++ 12 miscompiled
// when it captured the shared state by value (the closure destroyed twice: one reference released twice).
namespace {
asio::awaitable<net::admission::ticket> admit_like_the_client(net::admission* a) {
    if (!a) co_return net::admission::ticket();
    co_return co_await a->enter();
}

asio::awaitable<std::size_t> inner_call(std::string body) {
    co_await asio::post(asio::use_awaitable);
    co_return body.size();
}

asio::awaitable<std::size_t> call_like_the_client(net::admission* a, std::string body,
                                                  std::vector<net::admission::ticket>* kept,
                                                  net::admission::ticket turn = {}) {
    if (!turn.held()) turn = co_await admit_like_the_client(a);
    kept->push_back(std::move(turn));
    co_return co_await inner_call(std::move(body));
}

asio::awaitable<void> call_and_keep(net::admission* a, std::vector<net::admission::ticket>* kept,
                                    std::size_t* out) {
    *out = co_await call_like_the_client(a, std::string(64, 'x'), kept);
}

void run_ready(asio::io_context& io) {
    while (io.poll() > 0) {
    }
    io.restart();
}
}  // namespace

// The state is released exactly once per reference: a ticket won by waiting, dropped while the admission
// lives, leaves the admission whole; another, dropped after the admission is gone, touches nothing freed.
// (Released twice, the state was freed under the admission: a lock of a freed mutex, EINVAL thrown from a
// noexcept function under meson's MALLOC_PERTURB_, or a use-after-free under ASan.)
BOOST_AUTO_TEST_CASE(a_ticket_won_by_waiting_through_the_clients_call_shapes_is_released_once) {
    asio::io_context io;
    auto a = std::make_unique<net::admission>(1);
    admitted_order t;
    std::vector<net::admission::ticket> kept;
    std::size_t out = 0;
    for (int round = 0; round < 3; ++round) {
        spawn_checked(io, take(*a, t, round));
        run_ready(io);
        BOOST_TEST_REQUIRE(t.held.size() == 1u);
        spawn_checked(io, call_and_keep(a.get(), &kept, &out));
        run_ready(io);
        BOOST_TEST_REQUIRE(a->waiting() == 1u);
        t.held.clear();  // the call is admitted
        run_ready(io);
        BOOST_TEST_REQUIRE(kept.size() == 1u);
        BOOST_TEST(out == 64u);
        BOOST_TEST(a->held() == 1u);
        BOOST_TEST(a->waiting() == 0u);
        kept.clear();
        BOOST_TEST(a->held() == 0u);
        // A state freed too early is the next one's memory (same size, last freed first out): the two
        // admissions would then share one count.
        net::admission other(1);
        admitted_order o;
        spawn_checked(io, take(other, o, 0));
        run_ready(io);
        BOOST_TEST(other.held() == 1u);
        BOOST_TEST(a->held() == 0u);
    }
    // Once more, and the admission goes before the ticket.
    spawn_checked(io, take(*a, t, 3));
    run_ready(io);
    spawn_checked(io, call_and_keep(a.get(), &kept, &out));
    run_ready(io);
    t.held.clear();
    run_ready(io);
    BOOST_TEST_REQUIRE(kept.size() == 1u);
    a.reset();
    BOOST_TEST(kept.front().held());
    kept.clear();  // must not touch the freed admission
}

// A coroutine suspended while it holds a ticket is destroyed by its io_context's destructor; in `consume`
// that happens after the Stripe client (and its admission) are gone. So is a waiter's: the admission's
// destructor drops its handler, and Asio hands the frames' destruction to the executor.
namespace {
struct note_destroyed {
    bool* gone;
    ~note_destroyed() { *gone = true; }
};

asio::awaitable<void> hold_forever(net::admission& a, bool* gone) {
    note_destroyed note{gone};
    auto turn = co_await a.enter();
    asio::steady_timer never(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
    co_await never.async_wait(asio::use_awaitable);
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_frame_destroyed_with_its_io_context_drops_its_ticket_after_the_admission) {
    bool holder_gone = false;
    bool waiter_gone = false;
    auto io = std::make_unique<asio::io_context>();
    auto a = std::make_unique<net::admission>(1);
    spawn_checked(*io, hold_forever(*a, &holder_gone));
    spawn_checked(*io, hold_forever(*a, &waiter_gone));
    run_ready(*io);
    BOOST_TEST_REQUIRE(a->held() == 1u);
    BOOST_TEST_REQUIRE(a->waiting() == 1u);
    a.reset();  // the Stripe client goes first
    BOOST_TEST(!holder_gone);
    io.reset();  // the frames are destroyed with the loop; the holder drops its ticket
    BOOST_TEST(holder_gone);
    BOOST_TEST(waiter_gone);
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
