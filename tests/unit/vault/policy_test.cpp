#include "vault/policy.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::vault;

BOOST_AUTO_TEST_SUITE(policy)

BOOST_AUTO_TEST_CASE(operations_of_requests) {
    struct row {
        const char* method;
        const char* path;
        const char* op;
        bool creates;
    };
    for (auto r : {row{"POST", "/v1/charges", "charges.create", true},
                   row{"POST", "/v1/payment_intents", "payment_intents.create", true},
                   row{"GET", "/v1/charges", "charges.read", false},
                   row{"GET", "/v1/charges/ch_123", "charges.read", false},
                   row{"GET", "/v1/charges/search", "charges.read", false},
                   row{"GET", "/v1/payment_intents/pi_1", "payment_intents.read", false},
                   row{"GET", "/v1/payment_intents", "payment_intents.read", false},
                   row{"POST", "/v1/charges/ch_1", "", false},  // update: not governed
                   row{"POST", "/v1/charges/ch_1/capture", "", false},
                   row{"POST", "/v1/payment_intents/pi_1/confirm", "", false},
                   row{"POST", "/v1/refunds", "", false}, row{"GET", "/v1/customers", "", false},
                   row{"DELETE", "/v1/charges", "", false}, row{"GET", "/v1/chargesX", "", false},
                   row{"GET", "/v1/charges/", "", false}, row{"GET", "/v1/charges/a/b", "", false}}) {
        auto op = operation_for(r.method, r.path);
        BOOST_TEST(op.name == r.op, r.method << " " << r.path);
        BOOST_TEST(op.creates == r.creates, r.method << " " << r.path);
    }
}

BOOST_AUTO_TEST_CASE(allow_lists) {
    auto d = parse_allow_list(default_allow);
    BOOST_TEST_REQUIRE(d.has_value());
    BOOST_TEST(d->size() == 4u);
    auto one = parse_allow_list(" charges.create , charges.create,");
    BOOST_TEST_REQUIRE(one.has_value());
    BOOST_TEST(one->size() == 1u);
    BOOST_TEST(!parse_allow_list("").has_value());
    BOOST_TEST(!parse_allow_list("refunds.create").has_value());
    BOOST_TEST(!parse_allow_list("POST /v1/charges").has_value());
}

BOOST_AUTO_TEST_CASE(create_bodies) {
    auto ok = parse_create("amount=1999&currency=USD&customer=cus_1&metadata[a]=1&metadata%5Bb%5D=2", "usd");
    BOOST_TEST_REQUIRE(std::holds_alternative<create_params>(ok));
    auto p = std::get<create_params>(ok);
    BOOST_TEST(p.amount == 1999);
    BOOST_TEST(p.currency == "usd");
    BOOST_TEST(p.customer == "cus_1");
    BOOST_TEST(p.metadata_keys == 2);

    struct row {
        const char* body;
        const char* code;
        const char* param;
    };
    for (auto r : {row{"currency=usd", "parameter_missing", "amount"},
                   row{"amount=100", "parameter_missing", "currency"},
                   row{"amount=-5&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=0&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=1.5&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=1e3&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=1234567890123&currency=usd", "parameter_invalid_integer", "amount"},
                   row{"amount=100&amount=1&currency=usd", "parameter_invalid", "amount"},
                   row{"amount=100&currency=eur", "currency_mismatch", "currency"},
                   row{"amount=100&currency=usdx", "parameter_invalid", "currency"},
                   row{"amount=100&currency=usd&currency=usd", "parameter_invalid", "currency"},
                   row{"amount=100&currency=usd&customer=a&customer=b", "parameter_invalid", "customer"},
                   row{"amount=%ZZ&currency=usd", "parameter_invalid", ""}}) {
        auto out = parse_create(r.body, "usd");
        BOOST_TEST_REQUIRE(std::holds_alternative<refusal>(out), r.body);
        auto& f = std::get<refusal>(out);
        BOOST_TEST(f.status == 400, r.body);
        BOOST_TEST(f.type == "invalid_request_error", r.body);
        BOOST_TEST(f.code == r.code, r.body);
        BOOST_TEST(f.param == r.param, r.body);
    }
}

BOOST_AUTO_TEST_CASE(vault_tag_is_added_once_and_deterministically) {
    create_params p;
    auto once = with_vault_tag("amount=1&currency=usd", "key 1/ü", p);
    BOOST_TEST(once == "amount=1&currency=usd&metadata[cg_vault_idempotency_key]=key%201%2F%C3%BC");
    BOOST_TEST(with_vault_tag("amount=1&currency=usd", "key 1/ü", p) == once);
    BOOST_TEST(with_vault_tag(once, "key 1/ü", p) ==
               once);      // already tagged (e.g. a replay of the stored body)
    p.metadata_keys = 50;  // Stripe's limit: adding one would make Stripe refuse the request
    BOOST_TEST(with_vault_tag("amount=1", "k", p) == "amount=1");
}

BOOST_AUTO_TEST_CASE(settlement_of_answers) {
    struct row {
        int status;
        bool sent;
        settlement s;
    };
    for (auto r : {row{200, true, settlement::settle}, row{201, true, settlement::settle},
                   row{400, true, settlement::release}, row{402, true, settlement::release},
                   row{404, true, settlement::release}, row{409, true, settlement::release},
                   row{429, true, settlement::release}, row{424, true, settlement::uncertain},
                   row{500, true, settlement::uncertain}, row{502, true, settlement::uncertain},
                   row{503, true, settlement::uncertain}, row{0, true, settlement::uncertain},
                   row{0, false, settlement::release}, row{301, true, settlement::uncertain}})
        BOOST_TEST((settlement_for(r.status, r.sent) == r.s), r.status << " sent=" << r.sent);
}

BOOST_AUTO_TEST_CASE(error_bodies_are_stripe_shaped_json) {
    refusal r{402, "invalid_request_error", "spend_cap_exceeded", "over \"cap\"\n", "amount"};
    auto b = error_body(r);
    BOOST_TEST(b.find("\"code\": \"spend_cap_exceeded\"") != std::string::npos);
    BOOST_TEST(b.find("\"type\": \"invalid_request_error\"") != std::string::npos);
    BOOST_TEST(b.find("over \\\"cap\\\"\\n") != std::string::npos);
    BOOST_TEST(object_id("{\"id\":\"ch_1\",\"object\":\"charge\"}").value_or("") == "ch_1");
    BOOST_TEST(!object_id("{\"error\":{}}").has_value());
    BOOST_TEST(!object_id("not json").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
