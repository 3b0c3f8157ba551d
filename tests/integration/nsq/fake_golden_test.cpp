// fake-nsqd answers byte for byte like nsqd 1.3.0 (the golden transcripts), and is as strict.
#include <simdjson.h>

#include <array>
#include <boost/test/unit_test.hpp>

#include "../../unit/nsq/golden.hpp"
#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "nsq/http_get.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/frame.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
using namespace cg::test::nsq;
namespace proto = cg::nsq::proto;

namespace {

std::string golden_identify() {
    std::string out;
    proto::append_identify(
        out,
        R"({"client_id": "golden", "hostname": "h", "user_agent": "golden/1", "feature_negotiation": true, "heartbeat_interval": 1000, "msg_timeout": 5000})");
    return out;
}

std::string error_frame(const std::string& text) {
    std::string out;
    proto::append_frame(out, proto::frame_type::error, text);
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_session_matches_golden_bytes) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        raw_client c(ex);
        co_await c.connect(nsqd.tcp_port());
        co_await c.send(golden::magic + golden_identify());
        BOOST_TEST(co_await c.read_frame() == golden::identify_response);
        co_await c.send(golden::sub);
        BOOST_TEST(co_await c.read_frame() == golden::ok_frame);
        co_await c.send(golden::rdy1);
        nsqd.publish("golden", "hello golden");
        auto m = co_await c.read_frame();
        BOOST_REQUIRE(m.size() == golden::message_frame.size());
        BOOST_TEST(m.substr(0, 8) == golden::message_frame.substr(0, 8));    // size + type 2
        BOOST_TEST(m.substr(16, 2) == golden::message_frame.substr(16, 2));  // attempts 1
        BOOST_TEST(m.substr(34) == "hello golden");
        auto id = m.substr(18, 16);
        std::string cmd;
        proto::append_touch(cmd, id);
        proto::append_fin(cmd, id);
        proto::append_fin(cmd, id);
        co_await c.send(cmd);
        BOOST_TEST(co_await c.read_frame() ==
                   error_frame("E_FIN_FAILED FIN " + id + " failed ID not in flight"));
        co_await c.send(golden::req_unknown);
        BOOST_TEST(co_await c.read_frame() == golden::req_failed);
        BOOST_TEST(co_await c.read_frame(milliseconds(1500)) == golden::heartbeat);
        co_await c.send(golden::nop);
        co_await c.send(golden::cls);
        BOOST_TEST(co_await c.read_frame() == golden::close_wait);
        auto ch = nsqd.channel("golden", "c");
        BOOST_TEST(ch.finish_count == 1u);
        BOOST_TEST(ch.message_count == 1u);
        BOOST_TEST(nsqd.fatal_errors().empty());
    });
}

BOOST_AUTO_TEST_CASE(fatal_errors_match_golden_and_close) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        {  // RDY over max_rdy_count
            raw_client c(ex);
            co_await c.connect(nsqd.tcp_port());
            co_await c.send(golden::magic + golden_identify() + golden::sub);
            co_await c.read_frame();
            co_await c.read_frame();
            co_await c.send(golden::rdy3000);
            BOOST_TEST(co_await c.read_frame() == golden::rdy_invalid);
            BOOST_TEST(co_await c.closed_within(seconds(1)));
        }
        {  // msg_timeout over max-msg-timeout
            raw_client c(ex);
            co_await c.connect(nsqd.tcp_port());
            co_await c.send(golden::magic + golden::identify_big_timeout);
            BOOST_TEST(co_await c.read_frame() == golden::bad_body);
            BOOST_TEST(co_await c.closed_within(seconds(1)));
        }
        {  // heartbeats disabled: IDENTIFY ok (msg_timeout echoes the default), SUB refused
            raw_client c(ex);
            co_await c.connect(nsqd.tcp_port());
            co_await c.send(golden::magic + golden::identify_no_heartbeat);
            BOOST_TEST(co_await c.read_frame() == golden::identify_response_60000);
            co_await c.send(golden::sub);
            BOOST_TEST(co_await c.read_frame() == golden::sub_no_heartbeat_error);
            BOOST_TEST(co_await c.closed_within(seconds(1)));
        }
        {  // FIN before SUB
            raw_client c(ex);
            co_await c.connect(nsqd.tcp_port());
            co_await c.send(golden::magic + golden::fin_before_sub);
            BOOST_TEST(co_await c.read_frame() == golden::fin_before_sub_error);
            BOOST_TEST(co_await c.closed_within(seconds(1)));
        }
        {  // MPUB then PUB to a bad topic
            raw_client c(ex);
            co_await c.connect(nsqd.tcp_port());
            co_await c.send(golden::magic + golden::mpub2);
            BOOST_TEST(co_await c.read_frame() == golden::ok_frame);
            co_await c.send(golden::pub_bad_topic);
            BOOST_TEST(co_await c.read_frame() == golden::bad_topic_error);
            BOOST_TEST(co_await c.closed_within(seconds(1)));
        }
        BOOST_TEST(nsqd.topic_message_count("golden") == 2u);
        BOOST_TEST(nsqd.fatal_errors().size() == 5u);
    });
}

BOOST_AUTO_TEST_CASE(silent_client_gets_two_heartbeats_then_is_closed_after_two_seconds) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        raw_client c(ex);
        co_await c.connect(nsqd.tcp_port());
        auto t0 = steady_clock::now();  // before IDENTIFY: nsqd's read deadline starts when it reads it
        co_await c.send(golden::magic + golden_identify());
        co_await c.read_frame();
        BOOST_TEST(co_await c.read_frame(seconds(2)) == golden::heartbeat);
        BOOST_TEST(co_await c.read_frame(seconds(2)) == golden::heartbeat);
        BOOST_TEST(co_await c.closed_within(seconds(2)));
        auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
        BOOST_TEST(took >= 2000);
        BOOST_TEST(took < 3000);  // not a third heartbeat interval
        BOOST_TEST(nsqd.heartbeat_disconnects() == 1u);
    });
}

BOOST_AUTO_TEST_CASE(timeouts_touch_and_requeue_behave_like_nsqd) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd_options o;
        o.max_msg_timeout = milliseconds(1500);
        fake_nsqd nsqd(ex, o);
        BOOST_REQUIRE(nsqd.start().has_value());
        raw_client c(ex);
        co_await c.connect(nsqd.tcp_port());
        std::string idn;
        proto::append_identify(
            idn, R"({"feature_negotiation":true,"heartbeat_interval":5000,"msg_timeout":1000})");
        co_await c.send(golden::magic + idn + golden::sub + golden::rdy1);
        co_await c.read_frame();
        co_await c.read_frame();
        nsqd.publish("golden", "x");
        auto m = co_await c.read_frame();
        auto id = m.substr(18, 16);
        // TOUCH every 400 ms: the deadline moves, but never past delivery + max-msg-timeout (1.5 s).
        auto t0 = steady_clock::now();
        std::string again;
        for (;;) {
            co_await cg::net::sleep_for(milliseconds(400));
            std::string t;
            proto::append_touch(t, id);
            co_await c.send(t);
            auto ch = nsqd.channel("golden", "c");
            if (ch.timeout_count > 0) break;
            BOOST_REQUIRE(steady_clock::now() - t0 < seconds(3));
        }
        auto took = steady_clock::now() - t0;
        BOOST_TEST(duration_cast<milliseconds>(took).count() >= 1400);
        // Redelivered with attempts 2 (in flight < RDY 1 again after the timeout).
        for (;;) {
            auto f = co_await c.read_frame();
            if (f.substr(4, 4) == std::string("\0\0\0\2", 4)) {
                BOOST_TEST(cg::load_be16(reinterpret_cast<const std::uint8_t*>(f.data() + 16)) == 2);
                again = f.substr(18, 16);
                break;
            }
        }
        BOOST_TEST(again == id);
        std::string req;
        proto::append_req(req, id, 1000);  // deferred long enough to be seen on a loaded machine
        co_await c.send(req);
        BOOST_TEST(co_await eventually([&] { return nsqd.channel("golden", "c").deferred == 1; }));
        for (;;) {
            auto f = co_await c.read_frame();
            if (f.substr(4, 4) == std::string("\0\0\0\2", 4)) {
                BOOST_TEST(cg::load_be16(reinterpret_cast<const std::uint8_t*>(f.data() + 16)) == 3);
                break;
            }
        }
        BOOST_TEST(nsqd.channel("golden", "c").requeue_count == 1u);
    });
}

BOOST_AUTO_TEST_CASE(http_stats_and_lookup_use_the_real_field_names) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        fake_nsqlookupd lookupd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        BOOST_REQUIRE(lookupd.start().has_value());
        nsqd.create_channel("golden", "c");
        cg::net::host_port h{"127.0.0.1", nsqd.http_port()};
        auto ping = co_await cg::nsq::http_get(h, "/ping", "*/*", seconds(2));
        BOOST_REQUIRE(ping.has_value());
        BOOST_TEST(ping->body == "OK");
        auto stats = co_await cg::nsq::http_get(h, "/stats?format=json&topic=golden", "*/*", seconds(2));
        BOOST_REQUIRE(stats.has_value());
        simdjson::dom::parser p;
        simdjson::dom::element doc = p.parse(stats->body);
        BOOST_TEST(std::string_view(doc["version"]) == "1.3.0");
        auto ch = doc["topics"].at(0)["channels"].at(0);
        BOOST_TEST(std::string_view(ch["channel_name"]) == "c");
        // A named array: g++ 12 mishandles a braced list inside a coroutine (docs/contributing.md "Toolchain
        // facts").
        static const std::array<const char*, 11> keys = {
            "depth",         "backend_depth", "in_flight_count",       "deferred_count",
            "message_count", "requeue_count", "timeout_count",         "client_count",
            "clients",       "paused",        "e2e_processing_latency"};
        for (auto key : keys) BOOST_TEST(ch[key].error() == simdjson::SUCCESS, key);
        // Named, not braced inside co_await (g++ 12 miscompiles that; docs/contributing.md "Toolchain
        // facts").
        cg::net::host_port lh{"127.0.0.1", lookupd.http_port()};
        auto lk = co_await cg::nsq::http_get(lh, "/lookup?topic=nope", "application/vnd.nsq; version=1.0",
                                             seconds(2));
        BOOST_REQUIRE(lk.has_value());
        BOOST_TEST(lk->status == 404);
        BOOST_TEST(lk->body == R"({"message":"TOPIC_NOT_FOUND"})");
        lookupd.add_producer("golden", nsqd.producer());
        lk = co_await cg::nsq::http_get(lh, "/lookup?topic=golden", "application/vnd.nsq; version=1.0",
                                        seconds(2));
        BOOST_REQUIRE(lk.has_value());
        BOOST_TEST(lk->status == 200);
        BOOST_TEST(*lk->headers.get("X-Nsq-Content-Type") == "nsq; version=1.0");
        BOOST_TEST(lk->body.find("\"tcp_port\":" + std::to_string(nsqd.tcp_port())) != std::string::npos);
    });
}
