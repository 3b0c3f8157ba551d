#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>

#include "app/stripe_flags.hpp"

using namespace cg::app;

BOOST_AUTO_TEST_SUITE(stripe_flags_suite)

BOOST_AUTO_TEST_CASE(key_from_file_beats_env_and_is_trimmed) {
    std::string path = "/tmp/cg-stripe-key-" + std::to_string(::getpid());
    std::ofstream(path) << "sk_test_from_file\n";
    auto k = read_stripe_key(path, "sk_test_from_env");
    std::remove(path.c_str());
    BOOST_TEST_REQUIRE(k.has_value());
    BOOST_TEST(*k == "sk_test_from_file");
}

BOOST_AUTO_TEST_CASE(key_from_env_and_errors) {
    auto k = read_stripe_key("", "sk_test_env");
    BOOST_TEST_REQUIRE(k.has_value());
    BOOST_TEST(*k == "sk_test_env");
    BOOST_TEST(!read_stripe_key("", nullptr).has_value());
    BOOST_TEST(!read_stripe_key("", "").has_value());
    BOOST_TEST(!read_stripe_key("/nonexistent/key", "sk_test_env").has_value());
    BOOST_TEST(!read_stripe_key("", "sk_test with space").has_value());
}

BOOST_AUTO_TEST_CASE(flags_parse_into_config) {
    CLI::App app;
    stripe_flags f;
    add_stripe_flags(app, f);
    std::string path = "/tmp/cg-stripe-key2-" + std::to_string(::getpid());
    std::ofstream(path) << "rk_test_restricted";
    std::vector<std::string> args = {"--stripe-retry-max", "0.2", "--stripe-retry-initial", "0.05",
                                     "--stripe-max-retries", "4", "--stripe-key-file", path,
                                     "--stripe-api-base", "https://127.0.0.1:8443", "--stripe-request-timeout", "0.1"};
    std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
    app.parse(args);
    auto c = to_stripe_config(f);
    std::remove(path.c_str());
    BOOST_TEST(c.api_key == "rk_test_restricted");
    BOOST_TEST(c.api_base == "https://127.0.0.1:8443");
    BOOST_TEST(c.retry.max_retries == 4u);
    BOOST_TEST(c.retry.initial_delay.count() == 50);
    BOOST_TEST(c.retry.max_delay.count() == 200);
    BOOST_TEST(c.request_timeout.count() == 100);
}

BOOST_AUTO_TEST_CASE(bad_base_is_a_validation_error) {
    stripe_flags f;
    f.api_base = "api.stripe.com";
    BOOST_CHECK_THROW(to_stripe_config(f), CLI::ValidationError);
}

BOOST_AUTO_TEST_SUITE_END()
