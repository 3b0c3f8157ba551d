// chargeguard's `publish` and `tail` against the stock clients: what `publish` (MPUB) and the producer's
// DPUB put on real nsqd is what the stock nsq_tail reads, and what the stock to_nsq wrote is what
// `chargeguard tail` prints.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <set>

#include "harness.hpp"
#include "nsq/producer.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;

namespace {

std::string chargeguard() {
    auto p = env_or_empty("CHARGEGUARD_EXE");
    BOOST_REQUIRE_MESSAGE(!p.empty(), "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
        auto nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        if (nl > pos) out.push_back(text.substr(pos, nl - pos));
        pos = nl + 1;
    }
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(publish_and_dpub_are_read_back_by_stock_nsq_tail_and_tail_reads_stock_to_nsq) {
    auto nsq_tail = env_or_empty("NSQ_TAIL_BIN"), to_nsq = env_or_empty("TO_NSQ_BIN");
    if (nsq_tail.empty() || to_nsq.empty()) {
        BOOST_TEST_MESSAGE("skipped: NSQ_TAIL_BIN / TO_NSQ_BIN not set");
        return;
    }
    cg::test::run_async(
        [&]() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            real_nsqd nsqd;
            co_await nsqd.start();
            // The channel nsq_tail will read, created now so nsqd's queue scan (5 s refresh) sees it by the
            // time the deferred message is due.
            co_await nsqd.http().create_channel("fromcg", "tail");
            auto created = steady_clock::now();
            auto dir = make_temp_dir("tools");

            // --- stock to_nsq → chargeguard tail ---------------------------------------------------------
            std::vector<std::string> stock_lines;
            for (int i = 0; i < 25; ++i)
                stock_lines.push_back("{\"from\":\"to_nsq\",\"n\":" + std::to_string(i) + "}");
            {
                std::ofstream f(dir + "/stock.in");
                for (const auto& l : stock_lines) f << l << "\n";
            }
            auto pid = spawn({to_nsq, "--topic=fromstock", "--nsqd-tcp-address=" + nsqd.tcp_address()},
                             dir + "/to_nsq.out", dir + "/to_nsq.err", dir + "/stock.in");
            BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 0, slurp(dir + "/to_nsq.err"));
            pid = spawn({chargeguard(), "tail", "--topic", "fromstock", "--nsqd-tcp-address",
                         nsqd.tcp_address(), "--max-messages", "25", "--health-listen", "127.0.0.1:0"},
                        dir + "/tail.out", dir + "/tail.err");
            BOOST_TEST(co_await wait_exit(pid, seconds(20)) == 0, slurp(dir + "/tail.err"));
            std::multiset<std::string> got;
            for (const auto& line : lines_of(slurp(dir + "/tail.out"))) {
                simdjson::dom::parser p;
                simdjson::dom::element e;
                std::string_view body;
                BOOST_REQUIRE(p.parse(line).get(e) == simdjson::SUCCESS);
                BOOST_REQUIRE(e["body"].get_string().get(body) == simdjson::SUCCESS);
                got.insert(std::string(body));
            }
            BOOST_TEST((got == std::multiset<std::string>(stock_lines.begin(), stock_lines.end())),
                       slurp(dir + "/tail.out"));

            // --- chargeguard publish (MPUB) + producer DPUB → stock nsq_tail -------------------------------
            std::vector<std::string> events;
            for (int i = 0; i < 30; ++i)
                events.push_back(
                    "{\"customer_id\":\"c" + std::to_string(i) +
                    "\",\"billing_period\":\"2026-11\",\"amount_cents\":100,\"currency\":\"usd\","
                    "\"stripe_customer_id\":\"cus_" +
                    std::to_string(i) + "\"}");
            {
                std::ofstream f(dir + "/events.jsonl");
                for (const auto& l : events) f << l << "\n";
            }
            pid = spawn({chargeguard(), "publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic",
                         "fromcg", "--batch-size", "7", dir + "/events.jsonl"},
                        dir + "/pub.out", dir + "/pub.err");
            BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 0, slurp(dir + "/pub.err"));
            cg::nsq::producer prod(ex, nsqd.tcp_address(), {}, {});
            auto d = co_await prod.deferred_publish("fromcg", milliseconds(200), "{\"deferred\":true}");
            BOOST_TEST(d.has_value());
            co_await prod.close();
            // The deferred message is delivered once nsqd's queue scan watches the channel.
            auto left = created + queue_scan_refresh - steady_clock::now();
            if (left > steady_clock::duration::zero()) co_await cg::net::sleep_for(left);
            pid = spawn({nsq_tail, "--topic=fromcg", "--channel=tail",
                         "--nsqd-tcp-address=" + nsqd.tcp_address(), "-n", "31"},
                        dir + "/nsq_tail.out", dir + "/nsq_tail.err");
            BOOST_TEST(co_await wait_exit(pid, seconds(20)) == 0, slurp(dir + "/nsq_tail.err"));
            auto read = lines_of(slurp(dir + "/nsq_tail.out"));
            std::multiset<std::string> want(events.begin(), events.end());
            want.insert("{\"deferred\":true}");
            BOOST_TEST((std::multiset<std::string>(read.begin(), read.end()) == want),
                       slurp(dir + "/nsq_tail.out"));
            std::error_code ec;
            fs::remove_all(dir, ec);
        },
        seconds(60));
}
