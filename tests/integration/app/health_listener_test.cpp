// The health listener of the built binary: GET /config (the effective configuration, the same JSON
// `consume --validate` prints, never a secret), HTTPS on it, basic auth guarding /metrics and /config while
// the probes' routes stay open, the refusal of basic auth over plain http off loopback, and `chargeguard
// probe` reaching such a listener. consume runs with nothing to connect to (PostgreSQL, nsqd and Stripe are
// refused ports): its health listener serves before any of them answers, so no server is needed.
//
// Here /config and basic auth; HTTPS and the refusal off loopback are health_listener_tls_test.cpp.
#define BOOST_TEST_MODULE health_listener
#include "health_listener.hpp"

#include <boost/test/unit_test.hpp>

// GET /config: the effective configuration as JSON, byte for byte what `consume --validate` prints on its
// first line; it names the key's source and the DSN without its password, never the secrets themselves,
// nor the key file's content; the log neither.
BOOST_FIXTURE_TEST_CASE(config_is_served_as_validate_prints_it_without_secrets, fixture) {
    auto args = consume_args({"--health-listen", "127.0.0.1:0"});
    auto& c = spawn(args, pg_env());
    auto port = health_port(c);
    auto cfg = get(origin("http", port), "/config");
    BOOST_TEST_REQUIRE(cfg.ok, cfg.error);
    BOOST_TEST(cfg.status == 200);
    BOOST_TEST(has(cfg.content_type, "application/json"), cfg.content_type);
    BOOST_TEST(
        has(cfg.body, R"({"command":"consume","settings":{"topic":"billing","channel":"chargeguard",)"),
        cfg.body);
    BOOST_TEST(has(cfg.body, R"("stripe_key_from":")" + key_file + "\""), cfg.body);
    BOOST_TEST(has(cfg.body, R"("msg_timeout_ms":60000)"), cfg.body);
    BOOST_TEST(has(cfg.body, R"("health_listen":"127.0.0.1:0")"), cfg.body);
    BOOST_TEST(has(cfg.body, R"("pg":"host=127.0.0.1:1 dbname=billing user=chargeguard")"), cfg.body);
    for (const auto& secret : {stripe_key, pg_password, std::string("sk_test_")}) {
        BOOST_TEST(!has(cfg.body, secret), cfg.body);
        BOOST_TEST(!has(c.err(), secret), c.err());
    }

    // --validate: the same function, the same JSON, then the dependencies (none reachable: 78).
    args.push_back("--validate");
    auto& v = spawn(args, pg_env());
    BOOST_TEST(wait_exit(v, seconds(30)) == 78, v.err());
    auto out = v.out();
    auto first = out.substr(0, out.find('\n') + 1);
    BOOST_TEST(first == "config " + cfg.body, out);
    BOOST_TEST(has(out, "FAIL postgres"), out);
    for (const auto& secret : {stripe_key, pg_password}) {
        BOOST_TEST(!has(out, secret), out);
        BOOST_TEST(!has(v.err(), secret), v.err());
    }
}

// Basic auth: /metrics and /config answer 401 with a Basic challenge without credentials or with a wrong
// password; the right ones (twice: the second from the remembered digest) get the answer; /healthz,
// /readyz and /startupz stay open for probes. Neither the hash nor the password reaches /config or the log.
BOOST_FIXTURE_TEST_CASE(basic_auth_guards_metrics_and_config_not_the_probes, fixture) {
    auto& c = spawn(consume_args({"--health-listen", "127.0.0.1:0", "--health-basic-auth-file", auth_file}),
                    pg_env());
    auto o = origin("http", health_port(c));
    for (const char* path : {"/metrics", "/config"}) {
        auto none = get(o, path);
        BOOST_TEST_REQUIRE(none.ok, none.error);
        BOOST_TEST(none.status == 401, path);
        BOOST_TEST(none.www_authenticate == R"(Basic realm="chargeguard", charset="UTF-8")", path);
        BOOST_TEST(!has(none.body, "chargeguard_build_info"));
        auto wrong = get(o, path, basic(scrape_user, "not-the-password"));
        BOOST_TEST(wrong.status == 401, path);
        BOOST_TEST(has(wrong.www_authenticate, "Basic realm="), path);
        auto stranger = get(o, path, basic("someone-else", scrape_password));
        BOOST_TEST(stranger.status == 401, path);
        auto garbled = get(o, path, "Basic !!!!");
        BOOST_TEST(garbled.status == 401, path);
        for (int i = 0; i < 2; ++i) {
            auto right = get(o, path, basic(scrape_user, scrape_password));
            BOOST_TEST(right.status == 200, path << ": " << right.body);
        }
    }
    auto metrics = get(o, "/metrics", basic(scrape_user, scrape_password));
    BOOST_TEST(has(metrics.body, "chargeguard_build_info"));
    auto cfg = get(o, "/config", basic(scrape_user, scrape_password));
    BOOST_TEST(has(cfg.body, R"("health_basic_auth_users":1)"), cfg.body);
    for (const auto& secret : {auth_hash, scrape_password, stripe_key, pg_password}) {
        BOOST_TEST(!has(cfg.body, secret), cfg.body);
        BOOST_TEST(!has(c.err(), secret));
    }
    // The probes' routes answer without credentials (whatever their status: nothing is reachable).
    for (const char* path : {"/healthz", "/readyz", "/startupz"}) {
        auto open = get(o, path);
        BOOST_TEST_REQUIRE(open.ok, open.error);
        BOOST_TEST(open.status != 401, path);
        BOOST_TEST(open.www_authenticate.empty(), path);
    }
    BOOST_TEST(get(o, "/healthz").status == 200);
}

// proxy and webhooks serve /config too, each naming its command, with neither the Stripe key, the webhook
// signing secret nor the PostgreSQL password in it.
BOOST_FIXTURE_TEST_CASE(proxy_and_webhooks_serve_their_config_without_secrets, fixture) {
    const std::string webhook_secret = "whsec_health_listener_never_shown_0123";
    auto secret_file = write("webhook_secret", webhook_secret + "\n");
    struct service {
        const char* command;
        std::vector<std::string> args;
    };
    const service services[] = {
        {"proxy",
         {"proxy", "--listen", "127.0.0.1:0", "--stripe-key-file", key_file, "--health-listen",
          "127.0.0.1:0"}},
        {"webhooks",
         {"webhooks", "--listen", "127.0.0.1:0", "--webhook-secret-file", secret_file, "--health-listen",
          "127.0.0.1:0"}},
    };
    for (const auto& s : services) {
        auto& c = spawn(s.args, pg_env());
        auto cfg = get(origin("http", health_port(c)), "/config");
        BOOST_TEST_REQUIRE(cfg.ok, cfg.error);
        BOOST_TEST(cfg.status == 200, s.command);
        BOOST_TEST(has(cfg.body, std::string(R"({"command":")") + s.command +
                                     R"(","settings":{"listen":"127.0.0.1:0")"),
                   cfg.body);
        BOOST_TEST(has(cfg.body, R"("pg":"host=127.0.0.1:1 dbname=billing user=chargeguard")"), cfg.body);
        for (const auto& secret : {stripe_key, webhook_secret, pg_password}) {
            BOOST_TEST(!has(cfg.body, secret), cfg.body);
            BOOST_TEST(!has(c.err(), secret), c.err());
        }
    }
}
