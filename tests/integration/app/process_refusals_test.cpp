// The built binary's checks at start, end to end (process_e2e.hpp): --version and `version` print the same
// line, plain-http origins are refused, the key file's shape is checked.
#include <boost/test/unit_test.hpp>

#include "process_e2e.hpp"

// `chargeguard --version` and `chargeguard version` print the same line: version, revision, build type.
BOOST_FIXTURE_TEST_CASE(version_names_revision_and_build_type, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> flag_args{"--version"}, cmd_args{"version"};
        auto [rc1, flag] = co_await run_to_exit(flag_args);
        auto [rc2, cmd] = co_await run_to_exit(cmd_args);
        BOOST_TEST(rc1 == 0);
        BOOST_TEST(rc2 == 0);
        BOOST_TEST(flag == cmd);
        BOOST_TEST(has(cmd, "chargeguard " CHARGEGUARD_TEST_VERSION " (revision "), cmd);
        BOOST_TEST(has(cmd, ", " CHARGEGUARD_TEST_BUILD_TYPE ")"), cmd);
        BOOST_TEST(!has(cmd, "(revision , "), cmd);
    });
}

// http:// to Stripe or to the vault's upstream is a configuration error unless --allow-insecure-http is on
// the command line; the environment cannot switch it on.
BOOST_FIXTURE_TEST_CASE(plain_http_origins_are_refused, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> nsq{"--topic",    "t", "--channel", "c", "--nsqd-tcp-address",
                                           "127.0.0.1:1"};
        std::vector<std::string> consume{"consume", "--stripe-api-base", "http://127.0.0.1:1"};
        consume.insert(consume.end(), nsq.begin(), nsq.end());
        ::setenv("CHARGEGUARD_ALLOW_INSECURE_HTTP", "1", 1);
        auto [rc, err] = co_await run_to_exit(consume);
        ::unsetenv("CHARGEGUARD_ALLOW_INSECURE_HTTP");
        BOOST_TEST(rc != 0);
        BOOST_TEST(has(err, "--stripe-api-base"), err);
        BOOST_TEST(has(err, "http://127.0.0.1:1 is plain http"), err);

        const std::vector<std::string> proxy_args{"proxy", "--upstream", "http://127.0.0.1:1"};
        auto [prc, perr] = co_await run_to_exit(proxy_args);
        BOOST_TEST(prc != 0);
        BOOST_TEST(has(perr, "--upstream"), perr);
        BOOST_TEST(has(perr, "is plain http"), perr);

        // Allowed: past the configuration (it then fails on PostgreSQL, which is not what this is about).
        std::vector<std::string> allowed = consume;
        allowed.insert(allowed.end(), {"--allow-insecure-http", "--pg-dsn", "host=127.0.0.1 port=1",
                                       "--pg-startup-timeout", "0", "--health-listen", "127.0.0.1:0"});
        auto [arc, aerr] = co_await run_to_exit(allowed);
        BOOST_TEST(!has(aerr, "plain http"), aerr);
        BOOST_TEST(has(aerr, "consume starting"), aerr);
        (void)arc;
    });
}

// The key's shape is checked before anything connects, with a message naming where the key came from and
// never showing it.
BOOST_FIXTURE_TEST_CASE(key_file_shape_is_checked, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> base{
            "consume", "--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:1"};
        auto with_key_file = [&](const std::string& path) {
            auto a = base;
            a.insert(a.end(), {"--stripe-key-file", path});
            return a;
        };
        std::string file = tmp + "-key";
        std::ofstream(file) << "hello_not_a_key\n";
        auto [rc, err] = co_await run_to_exit(with_key_file(file));
        BOOST_TEST(rc != 0);
        BOOST_TEST(has(err, "the key from --stripe-key-file '" + file + "' is not a Stripe secret"), err);
        BOOST_TEST(!has(err, "hello_not_a_key"), err);

        std::ofstream(file) << "sk_test_ab cd\n";
        auto [wrc, werr] = co_await run_to_exit(with_key_file(file));
        BOOST_TEST(wrc != 0);
        BOOST_TEST(has(werr, "'" + file + "' contains whitespace"), werr);
        BOOST_TEST(!has(werr, "sk_test_ab"), werr);

        std::string dir = tmp + "-keydir";
        fs::create_directories(dir);
        auto [drc, derr] = co_await run_to_exit(with_key_file(dir));
        BOOST_TEST(drc != 0);
        BOOST_TEST(has(derr, "'" + dir + "' is a directory"), derr);

        auto [mrc, merr] = co_await run_to_exit(with_key_file(tmp + "-missing"));
        BOOST_TEST(mrc != 0);
        BOOST_TEST(has(merr, "cannot read --stripe-key-file '" + tmp + "-missing': No such file"), merr);

        ::setenv("STRIPE_API_KEY", "hello_env_not_a_key", 1);
        auto [erc, eerr] = co_await run_to_exit(base);
        ::setenv("STRIPE_API_KEY", stripe_key.c_str(), 1);
        BOOST_TEST(erc != 0);
        BOOST_TEST(has(eerr, "the key from STRIPE_API_KEY is not a Stripe secret"), eerr);
        BOOST_TEST(!has(eerr, "hello_env_not_a_key"), eerr);
        // The vault proxy holds the real key: a vault key (cgvk_) is refused there.
        ::setenv("STRIPE_API_KEY", "cgvk_abc_0123", 1);
        const std::vector<std::string> proxy_args{"proxy"};
        auto [vrc, verr] = co_await run_to_exit(proxy_args);
        ::setenv("STRIPE_API_KEY", stripe_key.c_str(), 1);
        BOOST_TEST(vrc != 0);
        BOOST_TEST(has(verr, "nor a vault key") == false, verr);
        BOOST_TEST(has(verr, "the key from STRIPE_API_KEY is not a Stripe secret"), verr);
        fs::remove(file);
        fs::remove_all(dir);
    });
}
