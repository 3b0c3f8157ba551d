#include "http/proto/message.hpp"

#include <boost/test/unit_test.hpp>

#include "http/proto/parser.hpp"

using namespace cg::http;

BOOST_AUTO_TEST_CASE(response_round_trip) {
    response r = make_response(503, "down\n");
    r.headers.add("X-A", "1");
    std::string wire;
    serialize(r, wire);
    BOOST_TEST(wire.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    BOOST_TEST(wire.find("Content-Length: 5\r\n") != std::string::npos);
    response_parser p;
    BOOST_TEST(p.feed(wire) == wire.size());
    BOOST_REQUIRE(p.state() == parse_state::done);
    BOOST_TEST(p.message().status == 503);
    BOOST_TEST(p.message().body == "down\n");
    BOOST_TEST(*p.message().headers.get("x-a") == "1");
}

BOOST_AUTO_TEST_CASE(head_serialization_omits_body) {
    std::string wire;
    serialize(make_response(200, "abc"), wire, true);
    BOOST_TEST(wire.find("Content-Length: 3") != std::string::npos);
    BOOST_TEST(wire.ends_with("\r\n\r\n"));
}

BOOST_AUTO_TEST_CASE(request_serialization) {
    request r;
    r.method = "POST";
    r.target = "/v1/charges";
    r.headers.add("Host", "api.stripe.com");
    r.body = "amount=100";
    std::string wire;
    serialize(r, wire);
    BOOST_TEST(wire ==
               "POST /v1/charges HTTP/1.1\r\nHost: api.stripe.com\r\nContent-Length: 10\r\n\r\namount=100");
}

BOOST_AUTO_TEST_CASE(keep_alive_rules) {
    request r;
    BOOST_TEST(r.keep_alive());
    r.headers.add("Connection", "Upgrade, Close");
    BOOST_TEST(!r.keep_alive());
    request old;
    old.version_minor = 0;
    BOOST_TEST(!old.keep_alive());
    old.headers.add("Connection", "keep-alive");
    BOOST_TEST(old.keep_alive());
}

BOOST_AUTO_TEST_CASE(url_codec) {
    BOOST_TEST(url_encode("metadata[billing_key]") == "metadata%5Bbilling_key%5D");
    BOOST_TEST(url_encode("a b&c=d~") == "a%20b%26c%3Dd~");
    BOOST_TEST(*url_decode("a+b%20c%5B") == "a b c[");
    BOOST_TEST(!url_decode("%4").has_value());
    BOOST_TEST(!url_decode("%zz").has_value());
    BOOST_TEST(*query_param("topic=billing&channel=a%23ephemeral", "channel") == "a#ephemeral");
    BOOST_TEST(*query_param("flag&x=1", "flag") == "");
    BOOST_TEST(!query_param("x=1", "y").has_value());
}
