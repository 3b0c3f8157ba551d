// The built `chargeguard` executable: `tail` refuses a bad --msg-timeout at startup, drains on SIGTERM
// with nothing timed out; `publish` MPUBs a JSONL file.
#include <fcntl.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <fstream>
#include <sstream>

#include "fake_nsqd.hpp"
#include "helpers.hpp"
#include "tests/support/run_async.hpp"

extern char** environ;

using namespace nsqtest;
using namespace cg::test::nsq;

namespace {

std::string exe() {
    const char* p = std::getenv("CHARGEGUARD_EXE");
    BOOST_REQUIRE_MESSAGE(p, "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

std::string temp_path(const std::string& name) {
    return "/tmp/cg-nsq-test-" + std::to_string(::getpid()) + "-" + name;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Starts the executable with stdout/stderr redirected to files.
pid_t spawn(std::vector<std::string> args, const std::string& out, const std::string& err) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    args.insert(args.begin(), exe());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    BOOST_REQUIRE(rc == 0);
    return pid;
}

// Waits for the child without blocking the loop (the fake nsqd runs on it). -1 on timeout.
asio::awaitable<int> wait_exit(pid_t pid, milliseconds limit) {
    int status = 0;
    bool exited = co_await eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, limit);
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        co_return -1;
    }
    co_return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

BOOST_AUTO_TEST_CASE(tail_refuses_a_bad_msg_timeout_before_connecting) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        auto out = temp_path("bad.out"), err = temp_path("bad.err");
        auto pid = spawn({"tail", "--topic", "t", "--nsqd-tcp-address", nsqd.tcp_address(), "--msg-timeout",
                          "500ms", "--health-listen", "127.0.0.1:0"},
                         out, err);
        int code = co_await wait_exit(pid, seconds(10));
        auto text = slurp(err);
        BOOST_TEST(code == 64);  // EX_USAGE
        BOOST_TEST(code != -1);
        BOOST_TEST(text.find("--msg-timeout") != std::string::npos, text);
        BOOST_TEST(text.find("--msg-timeout 500ms: out of range") != std::string::npos, text);
        BOOST_TEST(nsqd.total_connections() == 0u);
        // Same for a value over nsqd's max-msg-timeout, and a non-duration.
        pid =
            spawn({"tail", "--topic", "t", "--nsqd-tcp-address", nsqd.tcp_address(), "--msg-timeout", "16m"},
                  out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(10)) > 0);
        BOOST_TEST(slurp(err).find("--msg-timeout 16m: out of range") != std::string::npos);
        pid =
            spawn({"tail", "--topic", "t", "--nsqd-tcp-address", nsqd.tcp_address(), "--msg-timeout", "soon"},
                  out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(10)) > 0);
        BOOST_TEST(slurp(err).find("not a duration") != std::string::npos);
        ::unlink(out.c_str());
        ::unlink(err.c_str());
    });
}

BOOST_AUTO_TEST_CASE(tail_prints_json_lines_and_drains_on_sigterm) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.set_latency(milliseconds(5));  // keep messages in flight when SIGTERM lands
        for (int i = 0; i < 20000; ++i) nsqd.publish("tl", "{\"n\":" + std::to_string(i) + "}");
        auto out = temp_path("tail.out"), err = temp_path("tail.err");
        auto pid = spawn(
            {"tail", "--topic", "tl", "--channel", "tailtest", "--take-from-channel", "--nsqd-tcp-address",
             nsqd.tcp_address(), "--max-in-flight", "100", "--msg-timeout", "2s", "--heartbeat-interval",
             "1s", "--health-listen", "127.0.0.1:0", "--shutdown-timeout", "10"},
            out, err);
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.channel("tl", "tailtest").finish_count >= 300; },
                                          seconds(10)));
        BOOST_TEST(nsqd.channel("tl", "tailtest").in_flight > 0);
        ::kill(pid, SIGTERM);
        int code = co_await wait_exit(pid, seconds(15));
        BOOST_TEST(code == 0, slurp(err));
        // The process is gone; nsqd reads the last FINs before it sees the close.
        BOOST_REQUIRE(co_await eventually([&] { return nsqd.client_count() == 0; }));
        auto ch = nsqd.channel("tl", "tailtest");
        BOOST_TEST(ch.timeout_count == 0u);
        BOOST_TEST(ch.in_flight == 0);  // everything delivered was FINed before the connection closed
        BOOST_TEST(ch.requeue_count == 0u);
        BOOST_TEST(ch.depth > 0);  // it stopped consuming
        auto text = slurp(out);
        std::size_t lines = 0;
        simdjson::dom::parser p;
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line)) {
            ++lines;
            simdjson::dom::element doc;
            BOOST_REQUIRE(p.parse(line).get(doc) == simdjson::SUCCESS);
            BOOST_TEST(std::string_view(doc["id"]).size() == 16u);
            BOOST_TEST(std::int64_t(doc["attempts"]) == 1);
            BOOST_TEST(std::int64_t(doc["timestamp"]) > 0);
            BOOST_TEST(std::string_view(doc["body"]).substr(0, 5) == "{\"n\":");
        }
        BOOST_TEST(lines == ch.finish_count);
        BOOST_TEST(slurp(err).find("\"msg\":\"consumer stopped\"") != std::string::npos);
        ::unlink(out.c_str());
        ::unlink(err.c_str());
    });
}

BOOST_AUTO_TEST_CASE(publish_sends_a_jsonl_file_with_mpub) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        auto in = temp_path("events.jsonl"), out = temp_path("pub.out"), err = temp_path("pub.err");
        {
            std::ofstream f(in);
            for (int i = 0; i < 1234; ++i)
                f << "{\"customer_id\":\"c" << i << "\",\"billing_period\":\"2026-11\",\"amount_cents\":100,"
                  << "\"currency\":\"usd\",\"stripe_customer_id\":\"cus_" << i << "\"}\n";
            f << "\n";  // blank lines are skipped
        }
        auto pid = spawn({"publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "billing",
                          "--batch-size", "500", in},
                         out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 0, slurp(err));
        BOOST_TEST(nsqd.topic_message_count("billing") == 1234u);
        auto log = nsqd.command_log();
        BOOST_TEST(std::count(log.begin(), log.end(), "MPUB billing") == 3);
        BOOST_TEST(slurp(err).find("publish finished") != std::string::npos);
        {
            // Line 2 is JSON but not a billing event (money as a float): refused with the reason.
            std::ofstream f(in);
            f << "{\"customer_id\":\"a\",\"billing_period\":\"p\",\"amount_cents\":5,\"currency\":\"usd\","
                 "\"stripe_customer_id\":\"cus_a\"}\n{\"customer_id\":\"b\",\"amount_cents\":19.99}\nnot "
                 "json\n";
        }
        pid =
            spawn({"publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "billing", in}, out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 1);
        BOOST_TEST(slurp(err).find("\"line\":2") != std::string::npos, slurp(err));
        BOOST_TEST(slurp(err).find("amount_cents") != std::string::npos, slurp(err));
        BOOST_TEST(nsqd.topic_message_count("billing") == 1234u);  // the batch holding line 1 was not sent
        {
            // Refused after a batch went out: the connected producer is closed and the process exits.
            std::ofstream f(in);
            for (int i = 0; i < 3; ++i)
                f << "{\"customer_id\":\"d" << i << "\",\"billing_period\":\"p\",\"amount_cents\":5,"
                  << "\"currency\":\"usd\",\"stripe_customer_id\":\"cus_d\"}\n";
            f << "not json\n";
        }
        pid = spawn({"publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "billing",
                     "--batch-size", "2", in},
                    out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 1, slurp(err));
        BOOST_TEST(slurp(err).find("\"line\":4") != std::string::npos, slurp(err));
        BOOST_TEST(nsqd.topic_message_count("billing") == 1236u);  // the first batch of two went out
        // --no-validate lets any JSON object through (to exercise dead-lettering).
        {
            std::ofstream f(in);
            f << "{\"customer_id\":\"b\",\"amount_cents\":19.99}\n{\"anything\":true}\n";
        }
        pid = spawn(
            {"publish", "--no-validate", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "billing", in},
            out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 0, slurp(err));
        BOOST_TEST(nsqd.topic_message_count("billing") == 1238u);
        ::unlink(in.c_str());
        ::unlink(out.c_str());
        ::unlink(err.c_str());
    });
}

// --max-messages N takes at most N: RDY never above N (max_in_flight = min(--max-in-flight, N)), exactly N
// FINs, and anything received past the N-th printed is REQueued at once (timeout 0), never FINed.
BOOST_AUTO_TEST_CASE(tail_max_messages_takes_at_most_that_many) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        fake_nsqd nsqd(ex);
        BOOST_REQUIRE(nsqd.start().has_value());
        nsqd.record_commands(true);
        for (int i = 0; i < 50; ++i) nsqd.publish("tm", "{\"n\":" + std::to_string(i) + "}");
        auto out = temp_path("tm.out"), err = temp_path("tm.err");
        auto pid = spawn(
            {"tail", "--topic", "tm", "--channel", "tm#ephemeral", "--nsqd-tcp-address", nsqd.tcp_address(),
             "--max-messages", "5", "--max-in-flight", "100", "--health-listen", "127.0.0.1:0"},
            out, err);
        BOOST_TEST(co_await wait_exit(pid, seconds(20)) == 0, slurp(err));
        std::istringstream lines(slurp(out));
        std::string line;
        int printed = 0;
        while (std::getline(lines, line)) printed += !line.empty();
        BOOST_TEST(printed == 5);
        int fins = 0;
        for (const auto& c : nsqd.command_log()) {
            if (c.rfind("RDY ", 0) == 0) BOOST_TEST(std::stoll(c.substr(4)) <= 5, c);
            if (c.rfind("FIN ", 0) == 0) ++fins;
            if (c.rfind("REQ ", 0) == 0) BOOST_TEST(c.substr(c.rfind(' ') + 1) == "0", c);
        }
        BOOST_TEST(fins == 5);
        BOOST_TEST(nsqd.peak_channel_rdy() <= 5);
        ::unlink(out.c_str());
        ::unlink(err.c_str());
    });
}
