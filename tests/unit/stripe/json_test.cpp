#include "stripe/json.hpp"

#include <boost/test/unit_test.hpp>

#include "stripe/error.hpp"

using namespace cg::stripe;

BOOST_AUTO_TEST_SUITE(json)

BOOST_AUTO_TEST_CASE(parses_a_charge) {
    auto c = parse_charge(R"({"id":"ch_1","object":"charge","amount":4200,"currency":"usd",
        "customer":"cus_9","status":"succeeded","paid":true,"created":1700000000,"payment_intent":null,
        "metadata":{"billing_key":"abc","customer_id":"c1","n":"x"},"failure_code":null})");
    BOOST_TEST_REQUIRE(c.has_value());
    BOOST_TEST(c->id == "ch_1");
    BOOST_TEST(c->amount == 4200);
    BOOST_TEST(c->currency == "usd");
    BOOST_TEST(c->customer == "cus_9");
    BOOST_TEST(c->status == "succeeded");
    BOOST_TEST(c->paid);
    BOOST_TEST(c->created == 1700000000);
    BOOST_TEST(c->payment_intent.empty());
    BOOST_TEST(metadata_value(c->metadata, "billing_key").value_or("") == "abc");
    BOOST_TEST(c->metadata.size() == 3u);
}

BOOST_AUTO_TEST_CASE(expanded_customer_is_an_id) {
    auto c = parse_charge(R"({"id":"ch_2","object":"charge","customer":{"id":"cus_x","object":"customer"}})");
    BOOST_TEST_REQUIRE(c.has_value());
    BOOST_TEST(c->customer == "cus_x");
}

BOOST_AUTO_TEST_CASE(parses_payment_intent_and_list) {
    auto p = parse_payment_intent(R"({"id":"pi_1","object":"payment_intent","amount":5,"status":"succeeded",
        "latest_charge":"ch_7","metadata":{}})");
    BOOST_TEST_REQUIRE(p.has_value());
    BOOST_TEST(p->latest_charge == "ch_7");
    BOOST_TEST(p->status == "succeeded");
    auto l = parse_charge_page(R"({"object":"list","has_more":true,"url":"/v1/charges",
        "data":[{"id":"ch_b","object":"charge"},{"id":"ch_a","object":"charge"}]})");
    BOOST_TEST_REQUIRE(l.has_value());
    BOOST_TEST(l->has_more);
    BOOST_TEST_REQUIRE(l->data.size() == 2u);
    BOOST_TEST(l->data[1].id == "ch_a");
}

BOOST_AUTO_TEST_CASE(parses_errors) {
    auto e = parse_error(
        R"({"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds",
        "message":"Your card has insufficient funds.","charge":"ch_f"}})");
    BOOST_TEST_REQUIRE(e.has_value());
    BOOST_TEST(e->type == "card_error");
    BOOST_TEST(e->code == "card_declined");
    BOOST_TEST(e->decline_code == "insufficient_funds");
    BOOST_TEST(e->charge == "ch_f");
    BOOST_TEST(!parse_error("<html>502</html>").has_value());
    BOOST_TEST(!parse_error(R"({"id":"ch_1"})").has_value());
}

BOOST_AUTO_TEST_CASE(rejects_wrong_shapes) {
    BOOST_TEST(parse_charge("not json").code() == make_error_code(errc::bad_response));
    BOOST_TEST(parse_charge(R"({"id":"pi_1","object":"payment_intent"})").code() ==
               make_error_code(errc::bad_response));
    BOOST_TEST(parse_charge("[1,2]").code() == make_error_code(errc::bad_response));
    BOOST_TEST(!parse_charge_page(R"({"object":"list"})").has_value());
}

BOOST_AUTO_TEST_CASE(parses_refunds_and_their_list) {
    auto r = parse_refund(R"({"id":"re_1","object":"refund","amount":700,"currency":"usd","status":"pending",
        "charge":{"id":"ch_3","object":"charge"},"payment_intent":"pi_3","created":1700000100,
        "metadata":{"billing_key":"k-r2-p1"}})");
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST(r->id == "re_1");
    BOOST_TEST(r->amount == 700);
    BOOST_TEST(r->charge == "ch_3");
    BOOST_TEST(r->payment_intent == "pi_3");
    BOOST_TEST(r->status == "pending");
    BOOST_TEST(r->created == 1700000100);
    BOOST_TEST(metadata_value(r->metadata, "billing_key").value_or("") == "k-r2-p1");
    BOOST_TEST(!parse_refund(R"({"id":"ch_1","object":"charge"})").has_value());
    auto l = parse_refund_page(R"({"object":"list","has_more":false,"data":[
        {"id":"re_2","object":"refund","amount":1,"charge":"ch_3","status":"succeeded"},
        {"id":"re_3","object":"refund","amount":2,"charge":"ch_3","status":"failed"}]})");
    BOOST_TEST_REQUIRE(l.has_value());
    BOOST_TEST(l->data.size() == 2u);
    BOOST_TEST(!l->has_more);
    BOOST_TEST(l->data[1].status == "failed");
    auto bad = parse_refund_page(R"({"object":"list","data":[{"id":"ch_1","object":"charge"}]})");
    BOOST_TEST_REQUIRE(!bad.has_value());
    BOOST_TEST(bad.code() == errc::bad_response);
}

BOOST_AUTO_TEST_SUITE_END()
