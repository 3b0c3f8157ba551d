// nsqd 1.3.0's refusals, real and fake alike (conformance.hpp): IDENTIFY bounds refused with nsqd's own error
// frames byte for byte, and the consumer reporting nsqd's refusal of its msg_timeout while respecting
// max_rdy_count.
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "conformance.hpp"

BOOST_AUTO_TEST_CASE(identify_bounds_are_refused_with_nsqds_own_errors_byte_for_byte) {
    // Raw exchanges: every reply from real nsqd and fake-nsqd must be the same bytes.
    auto exchange = [](std::uint16_t port, std::string identify_json,
                       bool rdy_over) -> asio::awaitable<std::string> {
        cg::net::tcp_socket s(co_await asio::this_coro::executor);
        auto [cec] = co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port});
        if (cec) throw std::runtime_error("connect");
        std::string out;
        cg::nsq::proto::append_magic(out);
        cg::nsq::proto::append_identify(out, identify_json);
        if (rdy_over) {
            cg::nsq::proto::append_sub(out, "bounds", "c");
            cg::nsq::proto::append_rdy(out, 3000);
        }
        co_await asio::async_write(s, asio::buffer(out), cg::net::nothrow);
        std::string got = co_await nsqreal::read_until_close(s);  // every case here is fatal
        // The IDENTIFY reply in the RDY case differs in nothing but is long: keep only error frames.
        auto pos = got.find("E_");
        co_return pos == std::string::npos ? got : got.substr(pos - 8);
    };
    const std::vector<std::pair<std::string, bool>> cases = {
        {R"({"feature_negotiation":true,"msg_timeout":1000000})", false},
        {R"({"feature_negotiation":true,"msg_timeout":999})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":999})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":60001})", false},
        {R"({"feature_negotiation":true,"heartbeat_interval":1000})", true},
    };
    cg::test::run_async([&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd fake(ex);
        BOOST_REQUIRE(fake.start().has_value());
        for (const auto& [json, rdy] : cases) {
            auto real_bytes = co_await exchange(shared().nsqd->tcp_port(), json, rdy);
            auto fake_bytes = co_await exchange(fake.tcp_port(), json, rdy);
            BOOST_TEST(real_bytes.find("E_") != std::string::npos, json << " → " << real_bytes);
            BOOST_TEST(real_bytes == fake_bytes,
                       json << "\n  nsqd:      " << real_bytes << "\n  fake-nsqd: " << fake_bytes);
        }
        fake.stop();
    });
}

BOOST_AUTO_TEST_CASE(consumer_reports_nsqds_refusal_of_msg_timeout_and_respects_max_rdy_count) {
    cg::test::run_async(
        [&]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            nsqd_options no;
            no.extra = {"--max-msg-timeout=10s", "--max-rdy-count=3"};
            real_nsqd nsqd(no);
            co_await nsqd.start();
            fake_nsqd_options fo;
            fo.max_msg_timeout = seconds(10);
            fo.max_rdy_count = 3;
            fake_nsqd fake(ex, fo);
            BOOST_REQUIRE(fake.start().has_value());
            for (broker b : {broker{"nsqd", nsqd.tcp_address(), nsqd.http()},
                             broker{"fake-nsqd", fake.tcp_address(), nsqd_http{fake.http_port()}}}) {
                // 20 s is within what chargeguard accepts (≤ 15 min) but over this nsqd's --max-msg-timeout.
                {
                    auto sink = std::make_shared<cg::memory_sink>();
                    cg::metrics::registry reg;
                    auto cfg = config_for(b, "cap");
                    cfg.msg_timeout = seconds(20);
                    consumer c(
                        ex, cfg,
                        [](message&) -> asio::awaitable<disposition> { co_return disposition::finish(); },
                        cg::logger(sink, cg::log_level::info), reg);
                    BOOST_REQUIRE(c.start().has_value());
                    BOOST_TEST(
                        co_await eventually(
                            [&] {
                                return sink->contains("E_BAD_BODY IDENTIFY msg timeout (20000) is invalid");
                            },
                            seconds(5)),
                        b.name);
                    BOOST_TEST(c.stats().connects == 0u);
                    co_await c.stop();
                }
                // max_in_flight 10 against max_rdy_count 3: RDY never above 3 (E_INVALID would end the
                // connection).
                std::vector<std::string> bodies;
                for (int i = 0; i < 40; ++i) bodies.push_back("cap-" + std::to_string(i));
                co_await b.http.mpub("rdycap", bodies);
                cg::metrics::registry reg;
                auto cfg = config_for(b, "rdycap");
                cfg.max_in_flight = 10;
                std::set<std::string> seen;
                consumer c(
                    ex, cfg,
                    [&](message& m) -> asio::awaitable<disposition> {
                        seen.insert(m.body());
                        co_await cg::net::sleep_for(milliseconds(5));
                        co_return disposition::finish();
                    },
                    {}, reg);
                BOOST_REQUIRE(c.start().has_value());
                std::int64_t peak = 0;
                auto end = steady_clock::now() + seconds(10);
                while (seen.size() < 40 && steady_clock::now() < end) {
                    auto ch = co_await b.http.stats("rdycap", "c");
                    peak = std::max(peak, ch.ready_sum());
                }
                BOOST_TEST(seen.size() == 40u, b.name);
                BOOST_TEST(peak <= 3, b.name << " peak RDY " << peak);
                BOOST_TEST(peak >= 1, b.name);
                BOOST_TEST(c.stats().disconnects == 0u, b.name);
                co_await c.stop();
            }
            fake.stop();
        },
        seconds(60));
}
