#include "app/stripe_flags.hpp"

#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

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

// The default secret file is the last resort: read when it exists and nothing else names a key, ignored when
// STRIPE_API_KEY is set, and not an error source when it is absent.
BOOST_AUTO_TEST_CASE(default_secret_file_only_when_nothing_else_and_present) {
    std::string path = "/tmp/cg-stripe-default-" + std::to_string(::getpid());
    std::string missing = path + ".missing";
    std::ofstream(path) << "sk_test_from_default\n";
    auto k = read_stripe_key("", nullptr, path);
    auto from_env = read_stripe_key("", "sk_test_env", path);
    auto source = stripe_key_source("", nullptr, path);
    auto env_source = stripe_key_source("", "sk_test_env", path);
    std::remove(path.c_str());
    BOOST_TEST_REQUIRE(k.has_value());
    BOOST_TEST(*k == "sk_test_from_default");
    BOOST_TEST(source == path);
    BOOST_TEST_REQUIRE(from_env.has_value());
    BOOST_TEST(*from_env == "sk_test_env");
    BOOST_TEST(env_source == "STRIPE_API_KEY");
    BOOST_TEST(stripe_key_source("", nullptr, missing).empty());
    auto none = read_stripe_key("", nullptr, missing);
    BOOST_TEST_REQUIRE(!none.has_value());
    BOOST_TEST(none.err().message.find(missing) != std::string::npos);
    // A named file that is missing is an error even when the default exists (no silent fallback).
    std::ofstream(path) << "sk_test_from_default\n";
    auto named = read_stripe_key("/nonexistent/key", nullptr, path);
    std::remove(path.c_str());
    BOOST_TEST(!named.has_value());
}

BOOST_AUTO_TEST_CASE(key_shape_checks) {
    using cg::app::check_key_shape;
    using cg::app::key_kinds;
    for (const char* k : {"sk_test_abc", "sk_live_abc", "rk_test_abc", "rk_live_abc"}) {
        BOOST_TEST(check_key_shape(k, "STRIPE_API_KEY", key_kinds::stripe_only).has_value(), k);
        BOOST_TEST(check_key_shape(k, "STRIPE_API_KEY", key_kinds::stripe_or_vault).has_value(), k);
    }
    BOOST_TEST(check_key_shape("cgvk_id_00ff", "STRIPE_API_KEY", key_kinds::stripe_or_vault).has_value());
    auto vault_to_proxy = check_key_shape("cgvk_id_00ff", "STRIPE_API_KEY", key_kinds::stripe_only);
    BOOST_TEST_REQUIRE(!vault_to_proxy.has_value());
    BOOST_TEST(vault_to_proxy.err().message.find("cgvk") == std::string::npos);  // never echoes the key
    auto hello = check_key_shape("hello", "--stripe-key-file '/k'", key_kinds::stripe_or_vault);
    BOOST_TEST_REQUIRE(!hello.has_value());
    BOOST_TEST(hello.err().message.find("the key from --stripe-key-file '/k' is not a Stripe secret") == 0u,
               hello.err().message);
    BOOST_TEST(hello.err().message.find("hello") == std::string::npos);
    for (const char* k : {"sk_test_a b", " sk_test_a", "sk_test_a\tb", "sk_live_x\ny"}) {
        auto r = check_key_shape(k, "STRIPE_API_KEY", key_kinds::stripe_only);
        BOOST_TEST_REQUIRE(!r.has_value(), k);
        BOOST_TEST(r.err().message.find("contains whitespace") != std::string::npos, r.err().message);
    }
    BOOST_TEST(!check_key_shape("sk_abc", "STRIPE_API_KEY", key_kinds::stripe_only).has_value());
    BOOST_TEST(!check_key_shape("pk_test_abc", "STRIPE_API_KEY", key_kinds::stripe_only).has_value());
}

BOOST_AUTO_TEST_CASE(key_file_must_be_a_readable_file) {
    std::string dir = "/tmp/cg-stripe-keydir-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    auto d = read_stripe_key(dir, nullptr);
    std::filesystem::remove_all(dir);
    BOOST_TEST_REQUIRE(!d.has_value());
    BOOST_TEST(d.err().message ==
               "--stripe-key-file '" + dir + "' is a directory, not the file holding the key");
    auto m = read_stripe_key("/nonexistent/key", nullptr);
    BOOST_TEST_REQUIRE(!m.has_value());
    BOOST_TEST(m.err().message ==
               "cannot read --stripe-key-file '/nonexistent/key': No such file or directory");
}

BOOST_AUTO_TEST_CASE(plain_http_needs_the_test_flag) {
    CLI::App app;
    stripe_flags f;
    add_stripe_flags(app, f);
    ::setenv("STRIPE_API_KEY", "sk_test_env", 1);
    app.parse(std::vector<std::string>{"http://127.0.0.1:8080", "--stripe-api-base"});
    try {
        (void)to_stripe_config(f);
        BOOST_FAIL("http:// accepted without --allow-insecure-http");
    } catch (const CLI::ValidationError& e) {
        BOOST_TEST(std::string(e.what()).find("is plain http") != std::string::npos, e.what());
    }
    app.parse(
        std::vector<std::string>{"--allow-insecure-http", "http://127.0.0.1:8080", "--stripe-api-base"});
    BOOST_TEST(to_stripe_config(f).api_base == "http://127.0.0.1:8080");
    ::unsetenv("STRIPE_API_KEY");
}

BOOST_AUTO_TEST_CASE(flags_parse_into_config) {
    CLI::App app;
    stripe_flags f;
    add_stripe_flags(app, f);
    std::string path = "/tmp/cg-stripe-key2-" + std::to_string(::getpid());
    std::ofstream(path) << "rk_test_restricted";
    std::vector<std::string> args = {"--stripe-retry-max",       "0.2",
                                     "--stripe-retry-initial",   "0.05",
                                     "--stripe-max-retries",     "4",
                                     "--stripe-key-file",        path,
                                     "--stripe-api-base",        "https://127.0.0.1:8443",
                                     "--stripe-request-timeout", "0.1"};
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

BOOST_AUTO_TEST_CASE(rate_control_flags) {
    CLI::App app;
    stripe_flags f;
    add_stripe_flags(app, f);
    app.parse(std::vector<std::string>{});
    ::setenv("STRIPE_API_KEY", "sk_test_env", 1);
    auto d = to_stripe_config(f);
    BOOST_TEST(d.rate.max_rps == 0.0);  // no ceiling by default
    BOOST_TEST(d.rate.adaptive);        // AIMD on by default
    // The flags default to the policy's own defaults.
    BOOST_TEST(d.rate.decrease_factor == cg::stripe::rate_config{}.decrease_factor);
    BOOST_TEST(d.rate.increase_rps_per_s == cg::stripe::rate_config{}.increase_rps_per_s);
    BOOST_TEST(d.retry.max_rate_limited_retries == 8u);

    CLI::App app2;
    stripe_flags g;
    add_stripe_flags(app2, g);
    std::vector<std::string> args = {"--stripe-max-rps",       "30",  "--stripe-adaptive-rate", "false",
                                     "--stripe-rate-increase", "1.5", "--stripe-rate-decrease", "0.5",
                                     "--stripe-rate-min",      "2"};
    std::reverse(args.begin(), args.end());
    app2.parse(args);
    auto c = to_stripe_config(g);
    BOOST_TEST(c.rate.max_rps == 30.0);
    BOOST_TEST(!c.rate.adaptive);
    BOOST_TEST(c.rate.increase_rps_per_s == 1.5);
    BOOST_TEST(c.rate.decrease_factor == 0.5);
    BOOST_TEST(c.rate.min_rps == 2.0);

    CLI::App app3;
    stripe_flags h;
    add_stripe_flags(app3, h);
    std::vector<std::string> bad = {"1.5", "--stripe-rate-decrease"};  // reversed
    BOOST_CHECK_THROW(app3.parse(bad), CLI::ValidationError);
    h.max_rps = 5;
    h.rate_min = 10;
    BOOST_CHECK_THROW(to_stripe_config(h), CLI::ValidationError);
    ::unsetenv("STRIPE_API_KEY");
}

// The pool: 0 (the default) is 16 here (consume makes it --max-in-flight); past 64 it grows only while
// Stripe keeps its pace (http/pool_growth.hpp).
BOOST_AUTO_TEST_CASE(pool_flags) {
    ::setenv("STRIPE_API_KEY", "sk_test_env", 1);
    {
        CLI::App app;
        stripe_flags f;
        add_stripe_flags(app, f);
        app.parse(std::vector<std::string>{});
        auto c = to_stripe_config(f);
        BOOST_TEST(f.max_connections == 0u);
        BOOST_TEST(c.max_connections == 16u);
        BOOST_TEST(c.eager_connections == 64u);
    }
    {
        CLI::App app;
        stripe_flags f;
        add_stripe_flags(app, f);
        std::vector<std::string> args = {"--stripe-max-connections", "500", "--stripe-eager-connections",
                                         "8"};
        std::reverse(args.begin(), args.end());
        app.parse(args);
        auto c = to_stripe_config(f);
        BOOST_TEST(c.max_connections == 500u);
        BOOST_TEST(c.eager_connections == 8u);
    }
    {
        CLI::App app;
        stripe_flags f;
        add_stripe_flags(app, f);
        std::vector<std::string> args = {"--stripe-eager-connections", "0"};
        std::reverse(args.begin(), args.end());
        BOOST_CHECK_THROW(app.parse(args), CLI::ValidationError);
    }
    ::unsetenv("STRIPE_API_KEY");
}

BOOST_AUTO_TEST_CASE(bad_base_is_a_validation_error) {
    stripe_flags f;
    f.api_base = "api.stripe.com";
    BOOST_CHECK_THROW(to_stripe_config(f), CLI::ValidationError);
}

BOOST_AUTO_TEST_SUITE_END()
