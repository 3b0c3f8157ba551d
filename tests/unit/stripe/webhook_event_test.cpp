#include "stripe/webhook_event.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::stripe;

BOOST_AUTO_TEST_SUITE(webhook_event_envelope)

BOOST_AUTO_TEST_CASE(parses_the_envelope) {
    auto ev = parse_webhook_event(R"({
      "id": "evt_1", "object": "event", "api_version": "2024-06-20", "created": 1700000000,
      "livemode": true, "type": "charge.refunded", "pending_webhooks": 1,
      "data": {"object": {"id": "ch_9", "object": "charge", "amount_refunded": 500}}})");
    BOOST_TEST_REQUIRE(ev.has_value(), (ev ? std::string() : ev.err().describe()));
    BOOST_TEST(ev->id == "evt_1");
    BOOST_TEST(ev->type == "charge.refunded");
    BOOST_TEST(ev->created == 1700000000);
    BOOST_TEST(ev->livemode);
    BOOST_TEST(ev->object_id == "ch_9");
}

BOOST_AUTO_TEST_CASE(livemode_absent_is_test_mode_and_object_id_optional) {
    auto ev = parse_webhook_event(
        R"({"id":"evt_2","object":"event","type":"x.y","created":1,"data":{"object":{"object":"balance"}}})");
    BOOST_TEST_REQUIRE(ev.has_value());
    BOOST_TEST(!ev->livemode);
    BOOST_TEST(ev->object_id.empty());
}

BOOST_AUTO_TEST_CASE(refuses_what_is_not_an_event) {
    const char* bodies[] = {
        "",
        "not json",
        "[1,2]",
        R"({"id":"evt_1","object":"charge","type":"t","created":1,"data":{"object":{}}})",
        R"({"object":"event","type":"t","created":1,"data":{"object":{}}})",
        R"({"id":"","object":"event","type":"t","created":1,"data":{"object":{}}})",
        R"({"id":7,"object":"event","type":"t","created":1,"data":{"object":{}}})",
        R"({"id":"evt_1","object":"event","created":1,"data":{"object":{}}})",
        R"({"id":"evt_1","object":"event","type":"t","created":"1","data":{"object":{}}})",
        R"({"id":"evt_1","object":"event","type":"t","created":1})",
        R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":"x"}})",
        R"({"id":"evt_1","object":"event","type":"t","created":1,"livemode":"yes","data":{"object":{}}})",
    };
    for (const char* b : bodies) {
        BOOST_TEST_CONTEXT(b) {
            auto ev = parse_webhook_event(b);
            BOOST_TEST(!ev.has_value());
            if (!ev) BOOST_TEST(!ev.err().describe().empty());
        }
    }
    std::string long_id = R"({"id":")" + std::string(256, 'e') +
                          R"(","object":"event","type":"t","created":1,"data":{"object":{}}})";
    BOOST_TEST(!parse_webhook_event(long_id).has_value());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(webhook_event_unstorable)

BOOST_AUTO_TEST_CASE(what_no_table_can_hold_is_named) {
    struct row_case {
        const char* body;
        const char* why;  // a phrase of the reason; empty: storable
    };
    const row_case cases[] = {
        {R"({"id":"evt_1","object":"event","type":"t","created":1700000000,"data":{"object":{"id":"ch_1"}}})",
         ""},
        {R"({"id":"evt_1","object":"event","type":"t","created":9223372036854775807,"data":{"object":{}}})",
         "outside the years 1970 to 9999"},
        {R"({"id":"evt_1","object":"event","type":"t","created":-1,"data":{"object":{}}})",
         "outside the years 1970 to 9999"},
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":{"metadata":{"k":"a\u0000b"}}}})",
         "NUL character in the string at $.data.object.metadata.k"},
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":{"list":["x","\u0000"]}}})",
         "NUL character in the string at $.data.object.list[1]"},
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":{"a\u0000":1}}})",
         "NUL character in a key"},
        // An escaped backslash before u0000 is six ordinary characters.
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":{"k":"\\u0000"}}})", ""},
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"id":"evt_2","data":{"object":{}}})",
         "the key \"id\" twice in $"},
        {R"({"id":"evt_1","object":"event","type":"t","created":1,"data":{"object":{"amount":1,"amount":2}}})",
         "the key \"amount\" twice in $.data.object"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.body) {
            auto ev = parse_webhook_event(c.body);
            BOOST_TEST_REQUIRE(ev.has_value(), (ev ? std::string() : ev.err().describe()));
            if (*c.why == '\0')
                BOOST_TEST(ev->unstorable.empty(), ev->unstorable);
            else
                BOOST_TEST(ev->unstorable.find(c.why) != std::string::npos, ev->unstorable);
        }
    }
    // A NUL in the id leaves nothing to record the refusal under: not an event.
    BOOST_TEST(!parse_webhook_event(
                    R"({"id":"evt_\u0000","object":"event","type":"t","created":1,"data":{"object":{}}})")
                    .has_value());
}

BOOST_AUTO_TEST_CASE(the_api_version_is_read) {
    auto ev = parse_webhook_event(
        R"({"id":"evt_1","object":"event","api_version":"2022-08-01","type":"t","created":1,"data":{"object":{}}})");
    BOOST_TEST_REQUIRE(ev.has_value());
    BOOST_TEST(ev->api_version == "2022-08-01");
}

BOOST_AUTO_TEST_SUITE_END()
