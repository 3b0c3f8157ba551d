// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include "billing/store/ledger_batch.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "support/busy_for.hpp"

using namespace cg::billing;
using cg::test::busy_for;

BOOST_AUTO_TEST_CASE(array_literals_quote_every_element_and_escape_quotes_and_backslashes) {
    std::vector<std::string> plain = {"abc", "", "a\"b", "c\\d", "{x,y}", "NULL", " sp "};
    BOOST_TEST(text_array_literal(plain) == R"({"abc","","a\"b","c\\d","{x,y}","NULL"," sp "})");
    std::vector<std::optional<std::string>> opt = {std::string("a"), std::nullopt, std::string("")};
    BOOST_TEST(text_array_literal(opt) == R"({"a",NULL,""})");
    std::vector<std::int64_t> ints = {1, -2, 9223372036854775807};
    BOOST_TEST(int_array_literal(ints) == "{1,-2,9223372036854775807}");
    BOOST_TEST(text_array_literal(std::vector<std::string>{}) == "{}");
    BOOST_TEST(int_array_literal(std::vector<std::int64_t>{}) == "{}");
}

namespace {

// A statement that answers every request at once, and, as it finishes, arms a timer that is already due: the
// event-loop lag probe (or a heartbeat read) whose moment came while the loop was busy. The timer's handler
// can run only when the loop next polls for I/O and timers, so where it lands among the resuming callers
// shows how many of them one turn of the loop runs.
struct instant_runner {
    static inline asio::steady_timer* due = nullptr;
    static inline std::vector<int>* order = nullptr;

    static std::string_view key(const std::string& r) { return r; }
    static asio::awaitable<std::vector<cg::result<int>>> run(std::shared_ptr<cg::pg::pool>,
                                                             std::vector<std::string>& reqs) {
        due->expires_at(asio::steady_timer::clock_type::now());
        due->async_wait([](std::error_code) { order->push_back(-1); });
        std::vector<cg::result<int>> out;
        for (auto& r : reqs) out.emplace_back(std::stoi(r));
        co_return out;
    }
};

// Resumes 256 callers of one batch under the loop's turn `budget`, each caller working for `work` once
// resumed (its Stripe call's start, its FIN); returns the order they (i ≥ 0) and the due timer (-1) ran in.
std::vector<int> resume_order(std::chrono::microseconds budget, std::chrono::microseconds work) {
    asio::io_context io;
    cg::net::turn_budget::of(io.get_executor()).set(budget);
    asio::steady_timer due(io);
    std::vector<int> order;
    instant_runner::due = &due;
    instant_runner::order = &order;
    batch_options o;
    o.max_rows = 256;
    o.max_in_flight = 1;
    o.linger = [] { return std::chrono::microseconds(std::chrono::hours(1)); };  // until all 256 queued
    auto gc = std::make_shared<group_commit<std::string, int, instant_runner>>(nullptr, o);
    for (int i = 0; i < 256; ++i)
        asio::co_spawn(
            io,
            [&order, gc, i, work]() -> asio::awaitable<void> {
                auto r = co_await gc->submit(std::to_string(i));
                BOOST_TEST_REQUIRE(r.has_value());
                BOOST_TEST(*r == i);
                order.push_back(i);
                busy_for(work);
            },
            asio::detached);
    io.run();
    BOOST_TEST(gc->counters().statements == 1u);
    return order;
}

// The callers of resume_order()'s result, without the timer, and the order they submitted in.
std::vector<int> callers_in(const std::vector<int>& order) {
    std::vector<int> callers;
    for (int v : order)
        if (v >= 0) callers.push_back(v);
    return callers;
}
std::vector<int> arrival_order() {
    std::vector<int> v(256);
    std::iota(v.begin(), v.end(), 0);
    return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(under_a_turn_budget_a_finished_batch_leaves_room_for_a_due_timer) {
    // 256 callers of 50 µs each are 13 ms of work; a 1 ms budget lets about 20 run before the timer. A slow
    // or preempted machine only makes that fewer.
    auto paced = resume_order(std::chrono::microseconds(1000), std::chrono::microseconds(50));
    BOOST_TEST_REQUIRE(paced.size() == 257u);
    auto at = std::find(paced.begin(), paced.end(), -1) - paced.begin();
    BOOST_TEST_MESSAGE("turn budget 1 ms: the due timer ran after " << at << " of 256 callers");
    BOOST_TEST(at <= 64);
    BOOST_TEST(callers_in(paced) == arrival_order(), boost::test_tools::per_element());

    // The same work without a budget: the timer waits behind every caller.
    auto unpaced = resume_order(std::chrono::microseconds(0), std::chrono::microseconds(50));
    BOOST_TEST_REQUIRE(unpaced.size() == 257u);
    BOOST_TEST(unpaced.back() == -1);
}
