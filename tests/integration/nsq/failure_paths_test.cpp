// Failure paths against fake-nsqd (the shared scenarios also run against nsqd 1.3.0 in nsq_real):
// FIN/REQ/TOUCH refused once a connection is ending.
#include <boost/test/unit_test.hpp>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "scenarios.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
using nsqscenario::broker;

namespace {

// `address`: for a fake-nsqd started later on a port chosen now.
broker fake_broker(fake_nsqd& f, std::string name, std::string address = {}) {
    broker b;
    b.name = std::move(name);
    b.tcp_address = address.empty() ? f.tcp_address() : std::move(address);
    b.publish = [&f](std::string topic, std::vector<std::string> bodies) -> asio::awaitable<void> {
        for (auto& x : bodies) f.publish(topic, std::move(x));
        co_return;
    };
    b.channel = [&f](std::string topic, std::string channel) -> asio::awaitable<nsqscenario::channel_view> {
        auto c = f.channel(topic, channel);
        co_return nsqscenario::channel_view{c.depth, c.in_flight, c.deferred, c.timeout_count};
    };
    b.create_channel = [&f](std::string topic, std::string channel) -> asio::awaitable<void> {
        f.create_channel(topic, channel);
        co_return;
    };
    b.drop = [&f]() -> asio::awaitable<void> {
        f.drop_all_connections();
        co_return;
    };
    return b;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fin_req_and_touch_are_refused_once_the_connection_is_ending) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        co_await nsqscenario::answers_are_refused_once_the_connection_is_ending(
            fake_broker(nsqd, "fake-nsqd"), "ending");
        BOOST_TEST((nsqd.fatal_errors() ==
                    std::vector<std::string>{"E_INVALID RDY count 3000 out of range 0-2500"}));
    });
}
