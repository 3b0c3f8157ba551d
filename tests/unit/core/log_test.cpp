#include "core/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>

using namespace cg;

BOOST_AUTO_TEST_CASE(json_line_with_fields_and_context) {
    auto sink = std::make_shared<memory_sink>();
    logger log(sink, log_level::info);
    auto child = log.with({{"component", "nsq"}});
    child.info("connected", {{"addr", "127.0.0.1:4150"}, {"rdy", 25}, {"ok", true}, {"lag", 0.5}});
    child.debug("hidden");
    auto lines = sink->lines();
    BOOST_REQUIRE_EQUAL(lines.size(), 1u);
    const auto& l = lines[0];
    BOOST_TEST(l.starts_with("{\"time\":\""));
    BOOST_TEST(
        l.find("\"level\":\"info\",\"msg\":\"connected\",\"component\":\"nsq\",\"addr\":\"127.0.0.1:4150\","
               "\"rdy\":25,\"ok\":true,\"lag\":0.5}\n") != std::string::npos);
    BOOST_TEST(l.back() == '\n');
}

BOOST_AUTO_TEST_CASE(escapes_keep_lines_valid_json) {
    std::string out;
    append_json_string(out, std::string_view("a\"b\\c\nd\x01\xff\xc3\xa9", 11));
    BOOST_TEST(out == "\"a\\\"b\\\\c\\nd\\u0001\\ufffd\xc3\xa9\"");
}

BOOST_AUTO_TEST_CASE(levels) {
    BOOST_TEST((parse_log_level("warn") == log_level::warn));
    BOOST_TEST(!parse_log_level("loud").has_value());
    auto sink = std::make_shared<memory_sink>();
    logger log(sink, log_level::error);
    log.warn("dropped");
    log.error("kept");
    BOOST_TEST(sink->lines().size() == 1u);
    logger silent;
    silent.error("nowhere");  // must not crash
}

namespace {

// Everything readable from `fd` until EOF.
std::string read_all(int fd) {
    std::string out;
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) return out;
        out.append(buf, static_cast<std::size_t>(n));
    }
}

}  // namespace

// Lines reach the descriptor whole and in order; flush() returns once they are written.
BOOST_AUTO_TEST_CASE(async_sink_writes_lines_in_order) {
    int p[2];
    BOOST_TEST_REQUIRE(::pipe(p) == 0);
    auto reader = std::async(std::launch::async, [&] { return read_all(p[0]); });
    {
        auto sink = std::make_shared<async_fd_sink>(p[1]);
        logger log(sink, log_level::info);
        for (int i = 0; i < 1000; ++i) log.info("line", {{"i", i}});
        sink->flush();
        BOOST_TEST(sink->dropped() == 0u);
    }  // the writer has stopped: nothing writes to p[1] any more
    ::close(p[1]);
    auto text = reader.get();
    ::close(p[0]);
    std::size_t pos = 0;
    for (int i = 0; i < 1000; ++i) {
        auto at = text.find("\"i\":" + std::to_string(i) + "}\n", pos);
        BOOST_TEST_REQUIRE(at != std::string::npos, "line " << i);
        pos = at;
    }
}

// A log reader that stops reading (the pipe fills) never stops the caller: 20 000 lines into a stalled pipe
// return at once (the ones past the buffer dropped and counted); once the reader drains the pipe, the
// writer says how many were dropped and goes on. An fd_sink would block in write(2) after ~64 KiB.
BOOST_AUTO_TEST_CASE(async_sink_never_blocks_the_caller_on_a_stalled_reader) {
    int p[2];
    BOOST_TEST_REQUIRE(::pipe(p) == 0);
    auto sink = std::make_shared<async_fd_sink>(p[1], 256 * 1024);
    logger log(sink, log_level::info);
    const std::string pad(200, 'x');
    auto done = std::async(std::launch::async, [&] {
        for (int i = 0; i < 20000; ++i) log.info("stalled", {{"i", i}, {"pad", pad}});
    });
    // The bound is for a broken implementation only (one blocked in write(2) never gets here).
    bool returned = done.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    BOOST_TEST(returned);
    BOOST_TEST(sink->dropped() > 0u);
    // The reader wakes up: everything accepted is written, then the notice, then what follows.
    auto reader = std::async(std::launch::async, [&] { return read_all(p[0]); });
    sink->flush();  // the backlog is written: there is room again
    log.info("after the stall");
    sink->flush();
    auto dropped = sink->dropped();
    sink.reset();
    log = logger();
    ::close(p[1]);
    auto text = reader.get();
    ::close(p[0]);
    if (!returned) done.wait();
    // A writer thread the scheduler holds back can see the buffer fill more than once, so the drops may
    // come as several notices: together they account for every dropped line, all before the later line.
    const std::string tag = "\"msg\":\"log lines dropped: the log reader did not keep up\",\"dropped\":";
    std::uint64_t reported = 0;
    std::size_t first = std::string::npos, last = 0;
    for (auto at = text.find(tag); at != std::string::npos; at = text.find(tag, at + 1)) {
        if (first == std::string::npos) first = at;
        last = at;
        reported += std::stoull(text.substr(at + tag.size()));
    }
    BOOST_TEST(first != std::string::npos);
    BOOST_TEST(reported == dropped);
    auto after = text.find("after the stall");
    BOOST_TEST(after != std::string::npos);
    BOOST_TEST(last < after);
    BOOST_TEST(text.find("\"i\":0,") != std::string::npos);  // the first lines were kept
}
