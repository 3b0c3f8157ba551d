#include "nsq/message_queue.hpp"

#include <boost/test/unit_test.hpp>
#include <memory>
#include <vector>

using cg::nsq::ring_queue;

namespace {
std::vector<int> contents(ring_queue<int>& q) {
    std::vector<int> out;
    q.for_each([&](int& v) { out.push_back(v); });
    return out;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(message_queue)

BOOST_AUTO_TEST_CASE(first_in_first_out_across_growth_and_wrap_around) {
    ring_queue<int> q;
    BOOST_TEST(q.empty());
    int next_in = 0, next_out = 0;
    // Interleaved pushes and pops move the head around the ring while it grows past several sizes.
    for (int round = 0; round < 50; ++round) {
        for (int i = 0; i < 7; ++i) q.push(std::make_unique<int>(next_in++));
        for (int i = 0; i < 5; ++i) BOOST_TEST(*q.pop() == next_out++);
        BOOST_TEST(q.size() == static_cast<std::size_t>(next_in - next_out));
    }
    while (!q.empty()) BOOST_TEST(*q.pop() == next_out++);
    BOOST_TEST(next_out == next_in);
}

BOOST_AUTO_TEST_CASE(for_each_visits_in_order_and_remove_if_keeps_the_order_of_the_rest) {
    ring_queue<int> q;
    for (int i = 0; i < 20; ++i) q.push(std::make_unique<int>(i));
    for (int i = 0; i < 10; ++i) q.pop();  // the head is now mid-ring
    for (int i = 20; i < 30; ++i) q.push(std::make_unique<int>(i));
    std::vector<int> all(20);
    for (int i = 0; i < 20; ++i) all[i] = 10 + i;
    BOOST_TEST(contents(q) == all, boost::test_tools::per_element());

    std::vector<int> taken;
    q.remove_if([](const int& v) { return v % 3 == 0; },
                [&](std::unique_ptr<int> v) { taken.push_back(*v); });
    BOOST_TEST(taken == (std::vector<int>{12, 15, 18, 21, 24, 27}), boost::test_tools::per_element());
    std::vector<int> rest;
    for (int v : all)
        if (v % 3 != 0) rest.push_back(v);
    BOOST_TEST(contents(q) == rest, boost::test_tools::per_element());
    BOOST_TEST(q.size() == rest.size());
    q.push(std::make_unique<int>(99));  // still a queue after the removal
    BOOST_TEST(contents(q).back() == 99);
    BOOST_TEST(*q.pop() == rest.front());
}

BOOST_AUTO_TEST_SUITE_END()
