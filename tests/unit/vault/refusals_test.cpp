#include "vault/refusals.hpp"

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>

using namespace cg::vault;

BOOST_AUTO_TEST_SUITE(refusals_)

BOOST_AUTO_TEST_CASE(each_refusal_has_stripes_status_type_and_code) {
    struct row {
        refusal r;
        int status;
        std::string type, code;
    };
    const row rows[] = {
        {refusals::not_found("GET", "/x"), 404, "invalid_request_error", ""},
        {refusals::unauthenticated("cgvk_abc_secret"), 401, "invalid_request_error", ""},
        {refusals::key_unusable(), 401, "invalid_request_error", "api_key_expired"},
        {refusals::forbidden("charges.create"), 403, "invalid_request_error", ""},
        {refusals::too_large(65536), 413, "invalid_request_error", "request_too_large"},
        {refusals::idempotency_key_required(), 400, "invalid_request_error", "idempotency_key_required"},
        {refusals::cap_exceeded(1100, 1000, "usd"), 402, "invalid_request_error", "spend_cap_exceeded"},
        {refusals::amount_mismatch(), 400, "idempotency_error", ""},
        {refusals::key_expired(std::chrono::hours(23)), 400, "idempotency_error", "idempotency_key_expired"},
        {refusals::vault_unavailable(), 503, "api_error", "vault_unavailable"},
        {refusals::upstream_failure(false), 502, "api_error", "upstream_unreachable"},
        {refusals::upstream_failure(true), 504, "api_error", "upstream_timeout"},
    };
    for (const auto& r : rows) {
        BOOST_TEST(r.r.status == r.status);
        BOOST_TEST(r.r.type == r.type);
        BOOST_TEST(r.r.code == r.code);
        BOOST_TEST(!r.r.message.empty());
    }
}

BOOST_AUTO_TEST_CASE(messages_say_what_was_refused_and_never_echo_a_secret) {
    BOOST_TEST(refusals::not_found("GET", "/x").message == "Unrecognized request URL (GET: /x).");
    BOOST_TEST(refusals::forbidden("charges.create").message ==
               "This vault key does not allow charges.create.");
    BOOST_TEST(refusals::too_large(65536).message.find("65536 bytes") != std::string::npos);
    auto cap = refusals::cap_exceeded(1100, 1000, "usd");
    BOOST_TEST(cap.message.find("cap of 1100 usd (1000 already committed)") != std::string::npos);
    BOOST_TEST(cap.param == "amount");
    BOOST_TEST(refusals::key_expired(std::chrono::hours(23)).message.find("more than 23 hours") !=
               std::string::npos);
    BOOST_TEST(refusals::idempotency_key_required().param == "Idempotency-Key");
    auto unauth = refusals::unauthenticated("cgvk_0123456789abcdef_supersecretvalue");
    BOOST_TEST(unauth.message.find("supersecretvalue") == std::string::npos, unauth.message);
}

BOOST_AUTO_TEST_SUITE_END()
