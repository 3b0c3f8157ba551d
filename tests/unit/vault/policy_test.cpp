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
                   // A cancel moves no money: a key that may create intents may cancel its own.
                   row{"POST", "/v1/payment_intents/pi_1/cancel", "payment_intents.create", false},
                   row{"GET", "/v1/payment_intents/pi_1/cancel", "", false},
                   row{"POST", "/v1/payment_intents/ch_1/cancel", "", false},
                   row{"POST", "/v1/payment_intents/pi_1/x/cancel", "", false},
                   row{"POST", "/v1/refunds", "refunds.create", false},
                   row{"GET", "/v1/refunds", "refunds.read", false},
                   row{"GET", "/v1/refunds/re_1", "refunds.read", false},
                   row{"POST", "/v1/refunds/re_1", "", false},  // update: not governed
                   row{"POST", "/v1/refunds/re_1/cancel", "", false}, row{"GET", "/v1/customers", "", false},
                   row{"DELETE", "/v1/charges", "", false}, row{"GET", "/v1/chargesX", "", false},
                   row{"GET", "/v1/charges/", "", false}, row{"GET", "/v1/charges/a/b", "", false}}) {
        auto op = operation_for(r.method, r.path);
        BOOST_TEST(op.name == r.op, r.method << " " << r.path);
        BOOST_TEST(op.creates == r.creates, r.method << " " << r.path);
        BOOST_TEST(op.cancel == (std::string_view(r.path).ends_with("/cancel") && !op.name.empty()),
                   r.method << " " << r.path);
    }
    BOOST_TEST(cancelled_intent("/v1/payment_intents/pi_1/cancel") == "pi_1");
    BOOST_TEST(cancelled_intent("/v1/payment_intents/pi_1") == "");
}

BOOST_AUTO_TEST_CASE(allow_lists) {
    auto d = parse_allow_list(default_allow);
    BOOST_TEST_REQUIRE(d.has_value());
    BOOST_TEST(d->size() == 4u);
    auto one = parse_allow_list(" charges.create , charges.create,");
    BOOST_TEST_REQUIRE(one.has_value());
    BOOST_TEST(one->size() == 1u);
    BOOST_TEST(!parse_allow_list("").has_value());
    // Refunds only when asked for: never in the default list.
    BOOST_TEST(std::string(default_allow).find("refunds") == std::string::npos);
    auto refunds = parse_allow_list("charges.create,refunds.create,refunds.read");
    BOOST_TEST_REQUIRE(refunds.has_value());
    BOOST_TEST(refunds->size() == 3u);
    BOOST_TEST(operation_for("POST", "/v1/refunds").refund);
    BOOST_TEST(!operation_for("POST", "/v1/charges").refund);
    BOOST_TEST(!parse_allow_list("refunds.update").has_value());
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
                   row{"amount=100&amount=1&currency=usd", "", "amount"},
                   row{"amount=100&currency=eur", "currency_mismatch", "currency"},
                   row{"amount=100&currency=usdx", "", "currency"},
                   row{"amount=100&currency=usd&currency=usd", "", "currency"},
                   row{"amount=100&currency=usd&customer=a&customer=b", "", "customer"},
                   row{"amount=%ZZ&currency=usd", "", ""}}) {
        auto out = parse_create(r.body, "usd");
        BOOST_TEST_REQUIRE(std::holds_alternative<refusal>(out), r.body);
        auto& f = std::get<refusal>(out);
        BOOST_TEST(f.status == 400, r.body);
        BOOST_TEST(f.type == "invalid_request_error", r.body);
        BOOST_TEST(f.code == r.code, r.body);
        BOOST_TEST(f.param == r.param, r.body);
    }
}

BOOST_AUTO_TEST_CASE(names_rack_would_read_as_amount_currency_or_customer_are_refused) {
    // Stripe's parser (Rack's normalize_params) reads `amount]`, `[amount`, `]amount]` as amount, and
    // `amount[]` / `amount[x]` as an amount that is not the integer the proxy counted.
    struct row {
        const char* body;
        const char* param;
    };
    for (auto r : {row{"amount=100&currency=usd&amount]=99999", "amount"},
                   row{"amount=100&currency=usd&[amount=99999", "amount"},
                   row{"amount=100&currency=usd&%5Bamount%5D=99999", "amount"},
                   row{"amount=100&currency=usd&]amount]]=99999", "amount"},
                   row{"amount=100&currency=usd&amount[]=99999", "amount"},
                   row{"amount=100&currency=usd&amount[x]=99999", "amount"},
                   row{"amount]=99999&currency=usd", "amount"},
                   row{"amount=100&currency=usd&currency]=eur", "currency"},
                   row{"amount=100&currency=usd&[currency]=eur", "currency"},
                   row{"amount=100&currency=usd&customer=cus_a&customer[]=cus_b", "customer"},
                   row{"amount=100&currency=usd&[customer=cus_b", "customer"}}) {
        auto out = parse_create(r.body, "usd");
        BOOST_TEST_REQUIRE(std::holds_alternative<refusal>(out), r.body);
        auto& f = std::get<refusal>(out);
        BOOST_TEST(f.status == 400, r.body);
        BOOST_TEST(f.type == "invalid_request_error", r.body);
        BOOST_TEST(f.code == "", r.body);  // Stripe has no code for it
        BOOST_TEST(f.param == r.param, r.body);
    }
    // Names that only start like one of them are other parameters.
    for (const char* body :
         {"amount=100&currency=usd&amounts=1", "amount=100&currency=usd&metadata[amount]=1",
          "amount=100&currency=usd&customer_email=a", "amount=100&currency=usd&xamount=1"})
        BOOST_TEST(std::holds_alternative<create_params>(parse_create(body, "usd")), body);
}

BOOST_AUTO_TEST_CASE(the_vault_tag_cannot_be_sent_and_one_metadata_key_is_left_for_it) {
    for (const char* body : {"amount=1&currency=usd&metadata[cg_vault_idempotency_key]=other",
                             "amount=1&currency=usd&metadata%5Bcg_vault_idempotency_key%5D=other",
                             "amount=1&currency=usd&metadata[cg_vault_idempotency_key]]=other",
                             "amount=1&currency=usd&metadata[[cg_vault_idempotency_key]=other",
                             "amount=1&currency=usd&[metadata][cg_vault_idempotency_key]=other",
                             "amount=1&currency=usd&metadata[cg_vault_idempotency_key][x]=other",
                             "amount=1&currency=usd&metadata[cg_vault_idempotency_key]="}) {
        auto out = parse_create(body, "usd");
        BOOST_TEST_REQUIRE(std::holds_alternative<refusal>(out), body);
        auto& f = std::get<refusal>(out);
        BOOST_TEST(f.status == 400, body);
        BOOST_TEST(f.code == "", body);
        BOOST_TEST(f.param == "metadata[cg_vault_idempotency_key]", body);
    }
    auto with_keys = [](int n, bool repeat_one = false) {
        std::string b = "amount=1&currency=usd";
        for (int i = 0; i < n; ++i) b += "&metadata[k" + std::to_string(i) + "]=v";
        if (repeat_one) b += "&metadata[k0]=again";  // Rack: the last value wins, still one key
        return b;
    };
    auto ok = parse_create(with_keys(49, true), "usd");
    BOOST_TEST_REQUIRE(std::holds_alternative<create_params>(ok));
    BOOST_TEST(std::get<create_params>(ok).metadata_keys == 49);
    auto full = parse_create(with_keys(50), "usd");
    BOOST_TEST_REQUIRE(std::holds_alternative<refusal>(full));
    BOOST_TEST(std::get<refusal>(full).status == 400);
    BOOST_TEST(std::get<refusal>(full).param == "metadata");
    BOOST_TEST(std::get<refusal>(full).message.find("at most 49") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(vault_tag_is_always_added_and_deterministically) {
    auto once = with_vault_tag("amount=1&currency=usd", "key 1/ü");
    BOOST_TEST(once == "amount=1&currency=usd&metadata[cg_vault_idempotency_key]=key%201%2F%C3%BC");
    BOOST_TEST(with_vault_tag("amount=1&currency=usd", "key 1/ü") == once);
    BOOST_TEST(with_vault_tag("", "k") == "metadata[cg_vault_idempotency_key]=k");
    BOOST_TEST(carries_vault_tag(once, "key 1/ü"));
}

// The tagged body is held for the whole upstream call (thousands at once behind a slow Stripe): it is sized
// once, not grown to twice the body by appending.
BOOST_AUTO_TEST_CASE(the_tagged_body_holds_no_more_memory_than_its_size) {
    std::string body = "amount=1999&currency=usd&description=" + std::string(4000, 'x');
    auto tagged = with_vault_tag(body, "k-1");
    BOOST_TEST(tagged == body + "&metadata[cg_vault_idempotency_key]=k-1");
    BOOST_TEST(tagged.capacity() < tagged.size() + 64);
}

BOOST_AUTO_TEST_CASE(a_body_is_tagged_only_by_the_decoded_pair_with_its_own_key) {
    struct row {
        const char* body;
        bool tagged;
    };
    for (auto r :
         {row{"amount=1&metadata[cg_vault_idempotency_key]=k1", true},
          row{"amount=1&metadata%5Bcg_vault_idempotency_key%5D=k1", true},
          row{"amount=1&metadata[cg_vault_idempotency_key]=k2", false},  // another key's tag
          // the tag's spelling inside a value is not a tag
          row{"amount=1&description=metadata[cg_vault_idempotency_key]=k1", false},
          row{"amount=1&description=cg_vault_idempotency_key", false},
          row{"amount=1&metadata[x_cg_vault_idempotency_key]=k1", false},
          // as Stripe reads it, the last value wins
          row{"amount=1&metadata[cg_vault_idempotency_key]=k1&metadata[cg_vault_idempotency_key]]=k2", false},
          row{"amount=1&metadata[cg_vault_idempotency_key]=k2&metadata[cg_vault_idempotency_key]=k1", true},
          row{"amount=%ZZ&metadata[cg_vault_idempotency_key]=k1", false}, row{"", false}})
        BOOST_TEST(carries_vault_tag(r.body, "k1") == r.tagged, r.body);
}

BOOST_AUTO_TEST_CASE(create_envelopes) {
    struct row {
        const char* query;
        std::optional<std::string_view> content_type;
        bool ok;
        const char* param;
    };
    using sv = std::string_view;
    for (auto r :
         {row{"", std::nullopt, true, ""}, row{"", sv("application/x-www-form-urlencoded"), true, ""},
          row{"", sv("application/x-www-form-urlencoded; charset=utf-8"), true, ""},
          row{"", sv("Application/X-WWW-Form-Urlencoded ;charset=UTF-8"), true, ""},
          row{"amount=1", std::nullopt, false, ""},
          row{"expand[]=customer", sv("application/x-www-form-urlencoded"), false, ""},
          row{"", sv("application/json"), false, "Content-Type"},
          row{"", sv("multipart/form-data; boundary=x"), false, "Content-Type"},
          row{"", sv("text/plain"), false, "Content-Type"},
          row{"", sv("application/x-www-form-urlencodedx"), false, "Content-Type"},
          row{"", sv(""), false, "Content-Type"}}) {
        auto out = check_create_envelope(r.query, r.content_type);
        BOOST_TEST(!out.has_value() == r.ok, r.query << " " << r.content_type.value_or("(none)"));
        if (out) {
            BOOST_TEST(out->status == 400);
            BOOST_TEST(out->type == "invalid_request_error");
            BOOST_TEST(out->code == (*r.query ? "parameter_unknown" : ""));
            BOOST_TEST(out->param == r.param);
        }
    }
}

BOOST_AUTO_TEST_CASE(settlement_of_the_owners_answer) {
    struct row {
        int status;
        bool sent;
        settlement s;
    };
    for (auto r : {row{200, true, settlement::settle}, row{201, true, settlement::settle},
                   row{400, true, settlement::release}, row{401, true, settlement::release},
                   row{402, true, settlement::release}, row{403, true, settlement::release},
                   row{404, true, settlement::release}, row{429, true, settlement::release},
                   // another request with the key is executing at Stripe: it may charge
                   row{409, true, settlement::uncertain}, row{424, true, settlement::uncertain},
                   row{500, true, settlement::uncertain}, row{502, true, settlement::uncertain},
                   row{503, true, settlement::uncertain}, row{0, true, settlement::uncertain},
                   row{0, false, settlement::release}, row{301, true, settlement::uncertain}})
        BOOST_TEST((owner_settlement(r.status, r.sent) == r.s), r.status << " sent=" << r.sent);
}

BOOST_AUTO_TEST_CASE(settlement_of_a_replay) {
    using a = replay_action;
    struct row {
        int status;
        bool replayed;
        std::optional<bool> retry;
        const char* type;
        a want;
    };
    for (auto r : {row{200, true, std::nullopt, "", a::settle}, row{200, false, std::nullopt, "", a::settle},
                   row{201, false, std::nullopt, "", a::settle},
                   // before idempotency, or another same-key request executing: says nothing, never release
                   row{429, false, true, "invalid_request_error", a::defer},
                   row{429, false, std::nullopt, "invalid_request_error", a::defer},
                   row{401, false, std::nullopt, "invalid_request_error", a::defer},
                   row{403, false, std::nullopt, "invalid_request_error", a::defer},
                   row{409, false, true, "idempotency_error", a::defer},
                   row{409, false, std::nullopt, "idempotency_error", a::defer},
                   row{400, false, true, "invalid_request_error", a::defer},
                   row{402, false, true, "card_error", a::defer},
                   // the key was used with other parameters: the original may have executed
                   row{400, false, std::nullopt, "idempotency_error", a::search},
                   row{400, false, false, "idempotency_error", a::search},
                   // Stripe's saved failure: replaying says the same again
                   row{500, true, std::nullopt, "api_error", a::search},
                   row{503, true, std::nullopt, "api_error", a::search},
                   row{424, true, std::nullopt, "api_error", a::search},
                   row{500, false, std::nullopt, "api_error", a::defer},
                   row{424, false, std::nullopt, "api_error", a::defer},
                   row{0, false, std::nullopt, "", a::defer}, row{302, false, std::nullopt, "", a::defer},
                   // definitive: nothing moved under this key
                   row{400, false, std::nullopt, "invalid_request_error", a::release},
                   row{400, false, false, "invalid_request_error", a::release},
                   row{402, true, std::nullopt, "card_error", a::release},
                   row{402, false, false, "card_error", a::release},
                   row{404, false, std::nullopt, "invalid_request_error", a::release}}) {
        replay_answer ans{r.status, r.replayed, r.retry, r.type};
        BOOST_TEST((replay_settlement(ans) == r.want),
                   r.status << " replayed=" << r.replayed
                            << " retry=" << (r.retry ? (*r.retry ? "true" : "false") : "-") << " " << r.type);
    }
}

BOOST_AUTO_TEST_CASE(a_replay_is_in_the_window_only_if_the_age_now_is) {
    using namespace std::chrono;
    const seconds window = hours(23);
    struct row {
        seconds age_at_read;
        steady_clock::duration since_read;
        bool in;
    };
    for (auto r :
         {row{seconds(0), seconds(0), true}, row{hours(22), minutes(59), true},
          // read at 22 h 50 m; the pass took 15 minutes to reach the row: now past the window
          row{hours(22) + minutes(50), minutes(15), false},
          row{hours(23) - seconds(1), milliseconds(1), false},  // rounded up: never late by a fraction
          row{hours(23) - seconds(2), milliseconds(999), true}, row{hours(23), seconds(0), false},
          row{hours(30), seconds(0), false},
          row{hours(1), -seconds(5), true}})  // a clock that cannot go back, but be safe
        BOOST_TEST(replay_in_window(r.age_at_read, r.since_read, window) == r.in,
                   r.age_at_read.count()
                       << " s + " << duration_cast<milliseconds>(r.since_read).count() << " ms");
}

BOOST_AUTO_TEST_CASE(the_same_key_window_is_between_a_minute_and_23_hours) {
    using namespace std::chrono;
    BOOST_TEST(!same_key_window_problem(hours(23)).has_value());
    BOOST_TEST(!same_key_window_problem(minutes(1)).has_value());
    BOOST_TEST(!same_key_window_problem(hours(12)).has_value());
    BOOST_TEST(same_key_window_problem(seconds(59)).has_value());
    BOOST_TEST(same_key_window_problem(hours(23) + seconds(1)).has_value());
    auto why = same_key_window_problem(hours(24));
    BOOST_TEST_REQUIRE(why.has_value());
    BOOST_TEST(why->find("23h") != std::string::npos);
    BOOST_TEST(why->find("24 h") != std::string::npos);
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
