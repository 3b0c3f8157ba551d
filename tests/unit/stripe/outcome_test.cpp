#include "stripe/outcome.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::stripe;
using oc = outcome_class;

BOOST_AUTO_TEST_SUITE(outcome)

BOOST_AUTO_TEST_CASE(classifies_responses_table) {
    struct row {
        int status;
        const char* type;
        const char* code;
        std::optional<bool> retry;
        oc want;
        const char* param = "";
    };
    const row rows[] = {
        {200, "", "", {}, oc::succeeded},
        {201, "", "", {}, oc::succeeded},
        {200, "", "", false, oc::succeeded},
        {402, "card_error", "card_declined", {}, oc::declined},
        {402, "card_error", "authentication_required", {}, oc::declined},
        {402, "card_error", "insufficient_funds", false, oc::declined},
        {402, "invalid_request_error", "spend_cap_exceeded", {}, oc::cap_exceeded},
        {402, "card_error", "spend_cap_exceeded", {}, oc::cap_exceeded},
        {400, "idempotency_error", "", {}, oc::idempotency_conflict},
        {400, "idempotency_error", "idempotency_key_in_use", {}, oc::idempotency_conflict},
        {409, "idempotency_error", "idempotency_key_in_use", {}, oc::retry_same_key},
        {409, "", "", {}, oc::retry_same_key},
        {429, "invalid_request_error", "rate_limit", {}, oc::retry_same_key},
        {429, "invalid_request_error", "lock_timeout", {}, oc::retry_same_key},
        {500, "api_error", "", {}, oc::indeterminate},
        {502, "", "", {}, oc::indeterminate},
        {503, "", "", {}, oc::indeterminate},
        {504, "", "", {}, oc::indeterminate},
        {424, "", "", {}, oc::indeterminate},
        {500, "api_error", "", true, oc::retry_same_key},
        {503, "", "", false, oc::indeterminate},
        {400, "invalid_request_error", "parameter_missing", {}, oc::rejected},
        {400, "invalid_request_error", "", true, oc::retry_same_key},
        {400, "invalid_request_error", "resource_missing", {}, oc::rejected, "customer"},
        {400, "invalid_request_error", "", {}, oc::rejected},
        // The vault proxy's key-past-its-window refusal: search before a new generation, never a conflict.
        {400, "idempotency_error", "idempotency_key_expired", {}, oc::indeterminate},
        {404, "invalid_request_error", "resource_missing", {}, oc::rejected, "customer"},
        // Our setup, not the event: an operator fixes it and the same event must be charged then.
        {401, "invalid_request_error", "", {}, oc::setup_error},
        {401, "authentication_error", "api_key_expired", {}, oc::setup_error},
        {403, "invalid_request_error", "", {}, oc::setup_error},
        {403, "permission_error", "", {}, oc::setup_error},
        {404, "invalid_request_error", "", {}, oc::setup_error},  // "Unrecognized request URL"
        {404, "", "", {}, oc::setup_error},
        {405, "", "", {}, oc::setup_error},
        {407, "", "", {}, oc::setup_error},
        {413, "", "", {}, oc::setup_error},
        {301, "", "", {}, oc::setup_error},
        {302, "", "", {}, oc::setup_error},
        {403, "", "", false, oc::setup_error},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT(r.status << " " << r.type << "/" << r.code << " param=" << r.param
                                    << " retry=" << (r.retry ? (*r.retry ? "true" : "false") : "-")) {
            BOOST_TEST(to_string(classify_response({r.status, r.type, r.code, r.retry, r.param})) ==
                       to_string(r.want));
        }
    }
}

BOOST_AUTO_TEST_CASE(transport_failures) {
    BOOST_TEST(to_string(classify_transport_failure(false)) == "retry_same_key");
    BOOST_TEST(to_string(classify_transport_failure(true)) == "indeterminate");
}

BOOST_AUTO_TEST_CASE(should_retry_header) {
    BOOST_TEST(parse_should_retry(std::nullopt).has_value() == false);
    BOOST_TEST((parse_should_retry("true") == std::optional<bool>(true)));
    BOOST_TEST((parse_should_retry("TRUE") == std::optional<bool>(true)));
    BOOST_TEST((parse_should_retry("false") == std::optional<bool>(false)));
    BOOST_TEST(parse_should_retry("maybe").has_value() == false);
}

BOOST_AUTO_TEST_SUITE_END()
