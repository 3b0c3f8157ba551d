#include "core/log.hpp"

#include <boost/test/unit_test.hpp>

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
