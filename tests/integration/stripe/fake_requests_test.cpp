// The requests fake-stripe refuses as Stripe refuses them (unknown parameters, out-of-range values) and its
// search endpoints by metadata and customer (fake_async_fixture.hpp).
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "tests/integration/stripe/fake_async_fixture.hpp"

BOOST_AUTO_TEST_SUITE(fake_async)

// Requests Stripe refuses, with the code and param of its answer (built outside the coroutine: g++ 12
// mishandles braced lists of temporaries in coroutine frames).
struct refusal_row {
    std::string method, target, body, code, param;
};
std::vector<refusal_row> refusals(const std::string& charge) {
    return {
        {"GET", "/v1/charges?limit=10&colour=red", "", "parameter_unknown", "colour"},
        {"GET", "/v1/charges?limit=0", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/charges?limit=101", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/payment_intents?limit=ten", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/refunds?limit=1000", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/events?limit=-1", "", "parameter_invalid_integer", "limit"},
        {"GET", "/v1/charges?created[since]=1", "", "parameter_unknown", "created[since]"},
        {"GET", "/v1/charges?created[gte]=yesterday", "", "parameter_invalid_integer", "created[gte]"},
        {"GET", "/v1/refunds?customer=cus_ok", "", "parameter_unknown", "customer"},
        {"GET", "/v1/events?object=charge", "", "parameter_unknown", "object"},
        {"GET", "/v1/charges/" + charge + "?customer=cus_ok", "", "parameter_unknown", "customer"},
        {"GET", "/v1/charges/search?query=customer:'cus_ok'&limit=101", "", "parameter_invalid_integer",
         "limit"},
        {"GET", "/v1/charges/search?limit=5", "", "parameter_missing", "query"},
        {"POST", "/v1/charges", "amount=100&currency=usd&customer=cus_ok&colour=red", "parameter_unknown",
         "colour"},
        {"POST", "/v1/charges", "amount=1e3&currency=usd&customer=cus_ok", "parameter_invalid_integer",
         "amount"},
        {"POST", "/v1/charges", "amount=0&currency=usd&customer=cus_ok", "parameter_invalid_integer",
         "amount"},
        {"POST", "/v1/charges", "amount=100000000&currency=usd&customer=cus_ok", "amount_too_large",
         "amount"},
        {"POST", "/v1/charges",
         "amount=100&currency=usd&customer=cus_ok&description=", "parameter_invalid_empty", "description"},
        {"POST", "/v1/refunds", "charge=" + charge + "&amount=x", "parameter_invalid_integer", "amount"},
        {"POST", "/v1/refunds", "charge=" + charge + "&reason=", "parameter_invalid_empty", "reason"},
        {"POST", "/v1/payment_intents/pi_1Missing/cancel", "reason=abandoned", "parameter_unknown", "reason"},
    };
}

std::vector<std::string> accepted_reads(const std::string& charge) {
    return {"/v1/charges?limit=1", "/v1/charges?limit=100&created[gte]=0&customer=cus_ok",
            "/v1/events?types[]=charge.succeeded&types[]=charge.failed&limit=3",
            "/v1/refunds?charge=" + charge + "&limit=100",
            "/v1/charges/" + charge + "?expand[]=payment_intent"};
}

// What Stripe refuses, fake-stripe refuses with Stripe's codes: unknown parameters on every endpoint (GET
// filters included), `limit` outside 1..100, integers that are not, empty strings, an amount too large.
BOOST_AUTO_TEST_CASE(unknown_parameters_and_out_of_range_values_are_refused_as_stripe_refuses_them) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto o = co_await c->create_charge(test::charge_req("refusals-base"));
        BOOST_TEST_REQUIRE(o.charge.has_value());
        const auto rows = refusals(o.charge->id);
        int n = 0;
        for (const auto& r : rows) {
            std::string key;  // a named value: g++ 12 mishandles a conditional's temporary in a co_await
            if (r.method == "POST") key = "refusal-" + std::to_string(++n);
            auto got = co_await c->call(r.method, r.target, r.body, key);
            BOOST_TEST(got.http.resp.status == 400, r.target << " " << r.body);
            BOOST_TEST_REQUIRE(got.error.has_value(), r.target);
            BOOST_TEST(got.error->type == "invalid_request_error", r.target);
            BOOST_TEST(got.error->code == r.code, r.target << " " << r.body << ": " << got.http.resp.body);
            BOOST_TEST(got.http.resp.body.find("\"param\":\"" + r.param + "\"") != std::string::npos,
                       got.http.resp.body);
        }
        // The same parameters within range are taken.
        const auto reads = accepted_reads(o.charge->id);
        for (const auto& target : reads) {
            auto got = co_await c->call("GET", target, "", "");
            BOOST_TEST(got.http.resp.status == 200, target << ": " << got.http.resp.body);
        }
        auto events = co_await c->call("GET", "/v1/events?types[]=charge.succeeded&limit=3", "", "");
        BOOST_TEST(events.http.resp.body.find("charge.succeeded") != std::string::npos);
    });
}

// GET /v1/charges/search and /v1/payment_intents/search: metadata['k']:'v', customer:'cus_…' and AND, in
// Stripe's search_result shape, newest first, paged by next_page; a field Stripe cannot search is refused.
BOOST_AUTO_TEST_CASE(search_by_metadata_and_customer) {
    async_fixture f;
    auto c = f.client();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 3; ++i) {
            auto r = test::charge_req("search-" + std::to_string(i), i == 2 ? "cus_other" : "cus_ok");
            r.metadata = {{"billing_key", "bk-search"}, {"n", std::to_string(i)}};
            co_await c->create_charge(r);
        }
        co_await c->create_payment_intent(pi_req("search-pi", "pm_card_visa"));
        auto q = [&](std::string query, std::string extra = {}) {
            return c->call("GET", "/v1/charges/search?query=" + http::url_encode(query) + extra, "", "");
        };
        auto all = co_await q("metadata['billing_key']:'bk-search'");
        BOOST_TEST(all.http.resp.status == 200, all.http.resp.body);
        simdjson::dom::parser p;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(!p.parse(all.http.resp.body).get(doc));
        BOOST_TEST(std::string_view(doc["object"].get_string().value()) == "search_result");
        BOOST_TEST(doc["data"].get_array().size() == 3u);
        BOOST_TEST(doc["next_page"].is_null());
        BOOST_TEST(std::string_view(doc["url"].get_string().value()) == "/v1/charges/search");

        auto mine = co_await q("metadata['billing_key']:'bk-search' AND customer:'cus_ok'", "&limit=1");
        BOOST_TEST_REQUIRE(!p.parse(mine.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 1u);
        BOOST_TEST(doc["has_more"].get_bool().value());
        std::string next(doc["next_page"].get_string().value());
        std::string first(doc.at_pointer("/data/0/metadata/n").get_string().value());
        BOOST_TEST(first == "1");  // newest first
        auto page2 =
            co_await q("metadata['billing_key']:'bk-search' AND customer:'cus_ok'", "&limit=1&page=" + next);
        BOOST_TEST_REQUIRE(!p.parse(page2.http.resp.body).get(doc));
        BOOST_TEST(std::string_view(doc.at_pointer("/data/0/metadata/n").get_string().value()) == "0");
        BOOST_TEST(!doc["has_more"].get_bool().value());

        auto none = co_await q("metadata['billing_key']:'bk-nowhere'");
        BOOST_TEST_REQUIRE(!p.parse(none.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 0u);

        auto bad_field = co_await q("colour:'red'");
        BOOST_TEST(bad_field.http.resp.status == 400);
        auto bad_syntax = co_await q("customer:'cus_ok' OR customer:'cus_other'");
        BOOST_TEST(bad_syntax.http.resp.status == 400);

        auto pis = co_await c->call(
            "GET",
            "/v1/payment_intents/search?query=" + http::url_encode("metadata['billing_key']:'search-pi'"), "",
            "");
        BOOST_TEST_REQUIRE(!p.parse(pis.http.resp.body).get(doc));
        BOOST_TEST(doc["data"].get_array().size() == 1u);
        BOOST_TEST(std::string_view(doc.at_pointer("/data/0/object").get_string().value()) ==
                   "payment_intent");
    });
}

BOOST_AUTO_TEST_SUITE_END()
