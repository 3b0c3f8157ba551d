// What the consumer's tests against fake-nsqd share (consumer_test.cpp, consumer_lifecycle_test.cpp): the
// consumer configuration with short timers, and a handler that finishes at once.
#pragma once

#include <chrono>
#include <string>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "nsq/consumer.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;

namespace {

inline consumer_config base_config(const std::string& topic) {
    consumer_config c;
    c.topic = topic;
    c.channel = "billing";
    c.heartbeat_interval = milliseconds(1000);
    c.msg_timeout = milliseconds(2000);
    c.max_in_flight = 50;
    c.reconnect_backoff_min = milliseconds(50);
    c.reconnect_backoff_max = milliseconds(400);
    c.backoff_multiplier = milliseconds(20);
    c.max_backoff_duration = milliseconds(200);
    c.lookupd_poll_interval = milliseconds(200);
    c.rdy_redistribute_interval = milliseconds(100);
    c.low_rdy_idle_timeout = milliseconds(200);
    c.rdy_settle_delay = milliseconds(20);
    c.drain_timeout = milliseconds(5000);
    return c;
}

inline asio::awaitable<disposition> finish_now(message&) {
    co_return disposition::finish();
}

}  // namespace
