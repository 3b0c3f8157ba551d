#include "http/proto/parser.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::http;

BOOST_AUTO_TEST_CASE(parses_request_with_body) {
    request_parser p;
    std::string wire = "POST /v1/charges?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Y: z\r\n\r\nhello";
    BOOST_TEST(p.feed(wire) == wire.size());
    BOOST_REQUIRE(p.state() == parse_state::done);
    auto& r = p.message();
    BOOST_TEST(r.method == "POST");
    BOOST_TEST(r.target == "/v1/charges?x=1");
    BOOST_TEST(r.path() == "/v1/charges");
    BOOST_TEST(r.query() == "x=1");
    BOOST_TEST(r.body == "hello");
    BOOST_TEST(*r.headers.get("x-y") == "z");
    BOOST_TEST(r.keep_alive());
}

BOOST_AUTO_TEST_CASE(byte_at_a_time_and_pipelined) {
    request_parser p;
    std::string wire = "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n";
    std::size_t pos = 0;
    while (p.state() == parse_state::need_more) pos += p.feed(std::string_view(wire).substr(pos, 1));
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().target == "/a");
    p.reset();
    pos += p.feed(std::string_view(wire).substr(pos));
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().target == "/b");
    BOOST_TEST(!p.message().keep_alive());
    BOOST_TEST(pos == wire.size());
}

BOOST_AUTO_TEST_CASE(garbage_is_bad_message) {
    request_parser p;
    p.feed("\x16\x03\x01 this is not http\r\n\r\n");
    BOOST_REQUIRE(p.state() == parse_state::failed);
    BOOST_TEST((p.error() == errc::bad_message));
    BOOST_TEST(status_for(p.error()) == 400);
}

BOOST_AUTO_TEST_CASE(header_limit_does_not_depend_on_how_the_bytes_arrive) {
    std::string wire = "GET / HTTP/1.1\r\nAbcdefghijklmnopqrstuvwxyz0123: 1\r\n\r\n";
    parse_limits limits{.max_header_bytes = 64, .max_body_bytes = 64};
    request_parser whole(limits);
    whole.feed(wire);
    BOOST_REQUIRE(whole.state() == parse_state::done);
    request_parser bytewise(limits);
    for (std::size_t i = 0; i < wire.size() && bytewise.state() == parse_state::need_more; ++i)
        bytewise.feed(std::string_view(wire).substr(i, 1));
    BOOST_REQUIRE(bytewise.state() == parse_state::done);
    BOOST_TEST(bytewise.message().headers.get("abcdefghijklmnopqrstuvwxyz0123").value_or("") == "1");
}

BOOST_AUTO_TEST_CASE(oversize_headers_fail_before_buffering) {
    request_parser p(parse_limits{.max_header_bytes = 1024, .max_body_bytes = 1024});
    std::string wire = "GET / HTTP/1.1\r\nX-Big: " + std::string(2000, 'a');  // not even finished
    p.feed(wire);
    BOOST_REQUIRE(p.state() == parse_state::failed);
    BOOST_TEST((p.error() == errc::header_too_large));
    BOOST_TEST(status_for(p.error()) == 431);
}

BOOST_AUTO_TEST_CASE(oversize_content_length_fails_at_headers) {
    request_parser p(parse_limits{.max_header_bytes = 1024, .max_body_bytes = 100});
    p.feed("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n");
    BOOST_REQUIRE(p.state() == parse_state::failed);
    BOOST_TEST((p.error() == errc::body_too_large));
    BOOST_TEST(status_for(p.error()) == 413);
}

BOOST_AUTO_TEST_CASE(oversize_chunked_body_fails) {
    request_parser p(parse_limits{.max_header_bytes = 1024, .max_body_bytes = 10});
    p.feed(
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n");
    BOOST_REQUIRE(p.state() == parse_state::failed);
    BOOST_TEST((p.error() == errc::body_too_large));
}

BOOST_AUTO_TEST_CASE(chunked_response_and_eof_delimited_body) {
    response_parser p;
    p.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().status == 200);
    BOOST_TEST(p.message().body == "hello world");

    response_parser q;
    q.feed("HTTP/1.0 200 OK\r\n\r\nuntil close");
    BOOST_TEST((q.state() == parse_state::need_more));
    q.feed_eof();
    BOOST_REQUIRE(q.state() == parse_state::done);
    BOOST_TEST(q.message().body == "until close");
}

BOOST_AUTO_TEST_CASE(truncated_response_is_connection_closed) {
    response_parser p;
    p.feed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    p.feed_eof();
    BOOST_REQUIRE(p.state() == parse_state::failed);
    BOOST_TEST((p.error() == errc::connection_closed));
}

BOOST_AUTO_TEST_CASE(status_of_fewer_than_three_digits_is_bad_message) {
    for (const char* wire : {"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 2\r\n\r\n"}) {
        response_parser p;
        p.feed(wire);
        BOOST_REQUIRE(p.state() == parse_state::failed);
        BOOST_TEST((p.error() == errc::bad_message));
    }
    response_parser ok;
    ok.feed("HTTP/1.1 100 Continue\r\n\r\n");
    BOOST_TEST((ok.state() == parse_state::done));
}

BOOST_AUTO_TEST_CASE(head_response_has_no_body) {
    response_parser p;
    p.expect_no_body(true);
    p.feed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().body.empty());
}

BOOST_AUTO_TEST_CASE(reason_phrase_and_status) {
    response_parser p;
    p.feed("HTTP/1.1 402 Payment Required\r\nContent-Length: 2\r\n\r\n{}");
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().status == 402);
    BOOST_TEST(p.message().reason == "Payment Required");
}
