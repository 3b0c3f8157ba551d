// What the conformance tests against real nsqd share (conformance_test.cpp, conformance_refusals_test.cpp):
// one nsqd for the executable, started on first use with the shared topics' channels created, and a broker
// (real or fake) with the consumer configuration its scenarios use. In a named namespace: one shared nsqd
// however the files are compiled.
#pragma once

#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "fake_nsqd.hpp"
#include "harness.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/identify.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;
using cg::test::nsq::fake_nsqd;
using cg::test::nsq::fake_nsqd_options;

namespace nsq_conformance {
// Topics the shared nsqd knows from its start, with channel "c" created, so nsqd's queue scan (which
// picks up new channels only every 5 s) already watches them when a test needs message timeouts.
inline const std::vector<std::string> shared_topics = {"late", "keep", "defer", "drain", "pause", "rdycap"};

struct shared_nsqd {
    std::unique_ptr<real_nsqd> nsqd;
    steady_clock::time_point channels_created{};
};

inline shared_nsqd& shared() {
    static shared_nsqd s;
    if (!s.nsqd) {
        s.nsqd = std::make_unique<real_nsqd>();
        cg::test::run_async([&]() -> asio::awaitable<void> {
            co_await s.nsqd->start();
            auto h = s.nsqd->http();
            for (const auto& t : shared_topics) co_await h.create_channel(t, "c");
        });
        s.channels_created = steady_clock::now();
    }
    return s;
}

// Waits (on a timer) until nsqd's queue scan has seen the shared channels.
inline asio::awaitable<void> await_scanned() {
    auto left = shared().channels_created + queue_scan_refresh - steady_clock::now();
    if (left > steady_clock::duration::zero()) co_await cg::net::sleep_for(left);
}

struct broker {
    std::string name;
    std::string tcp;
    nsqd_http http;
};

inline consumer_config config_for(const broker& b, const std::string& topic) {
    consumer_config c;
    c.topic = topic;
    c.channel = "c";
    c.nsqd_tcp_addresses = {b.tcp};
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(1000);
    c.max_in_flight = 1;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(400);
    c.drain_timeout = milliseconds(5000);
    return c;
}

}  // namespace nsq_conformance

using namespace nsq_conformance;
