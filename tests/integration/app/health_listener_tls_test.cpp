// The health listener of the built binary over HTTPS (health_listener.hpp): verified against the test CA,
// guarded routes still asking for credentials, `chargeguard probe` reaching it; and basic auth over plain
// http off loopback refused.
#include <boost/test/unit_test.hpp>

#include "health_listener.hpp"

// HTTPS on the health listener: verified against the test CA, plain http gets no answer, the guarded routes
// still ask for credentials; `chargeguard probe` reaches it with the CA and a credentials file (or from the
// environment: the bare-path form follows CHARGEGUARD_HEALTH_LISTEN and CHARGEGUARD_HEALTH_TLS_CERT_FILE).
BOOST_FIXTURE_TEST_CASE(tls_listener_with_auth_and_probe, fixture) {
    auto& c = spawn(consume_args({"--health-listen", "127.0.0.1:0", "--health-tls-cert-file",
                                  test::cert("server.pem"), "--health-tls-key-file", test::cert("server.key"),
                                  "--health-basic-auth-file", auth_file}),
                    pg_env());
    auto port = health_port(c);
    BOOST_TEST(has(c.err(), R"("tls":true,"basic_auth":true)"), c.err());
    auto live = get(origin("https", port), "/healthz");
    BOOST_TEST_REQUIRE(live.ok, live.error);
    BOOST_TEST(live.status == 200);
    auto plain = get(origin("http", port), "/healthz");
    BOOST_TEST((!plain.ok || plain.status != 200), plain.body);
    BOOST_TEST(get(origin("https", port), "/metrics").status == 401);
    BOOST_TEST(get(origin("https", port), "/metrics", basic(scrape_user, scrape_password)).status == 200);

    auto url = origin("https", port) + "/metrics";
    auto probe = [&](std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
        args.insert(args.begin(), "probe");
        auto& p = spawn(args, env);
        int rc = wait_exit(p, seconds(20));
        return std::pair{rc, p.out() + p.err()};
    };
    auto ca = test::cert("ca.pem");
    auto [ok_rc, ok_out] =
        probe({"--health-ca-file", ca, "--health-credentials-file", credentials_file, url});
    BOOST_TEST(ok_rc == 0, ok_out);
    BOOST_TEST(has(ok_out, "/metrics: 200"), ok_out);
    BOOST_TEST(has(ok_out, "chargeguard_build_info"), ok_out);
    BOOST_TEST(!has(ok_out, scrape_password), ok_out);
    auto [none_rc, none_out] = probe({"--health-ca-file", ca, url});
    BOOST_TEST(none_rc == 1, none_out);
    BOOST_TEST(has(none_out, "/metrics: 401"), none_out);
    auto [wrong_rc, wrong_out] =
        probe({"--health-ca-file", ca, "--health-credentials-file", wrong_credentials_file, url});
    BOOST_TEST(wrong_rc == 1, wrong_out);
    BOOST_TEST(has(wrong_out, "/metrics: 401"), wrong_out);
    // Without the test CA the listener's certificate is not trusted.
    auto [untrusted_rc, untrusted_out] = probe({"--health-credentials-file", credentials_file, url});
    BOOST_TEST(untrusted_rc == 1, untrusted_out);
    BOOST_TEST(!has(untrusted_out, ": 200"), untrusted_out);
    // The container's form: a bare path, everything from the environment.
    auto [env_rc, env_out] =
        probe({"/config"}, {{"CHARGEGUARD_HEALTH_LISTEN", "127.0.0.1:" + std::to_string(port)},
                            {"CHARGEGUARD_HEALTH_TLS_CERT_FILE", test::cert("server.pem")},
                            {"CHARGEGUARD_HEALTH_CA_FILE", ca},
                            {"CHARGEGUARD_HEALTH_CREDENTIALS_FILE", credentials_file}});
    BOOST_TEST(env_rc == 0, env_out);
    BOOST_TEST(has(env_out, "https://127.0.0.1:" + std::to_string(port) + "/config: 200"), env_out);
    BOOST_TEST(has(env_out, R"("command":"consume")"), env_out);
}

// Basic auth off loopback without TLS is refused at startup (64) unless acknowledged; with TLS it starts.
// An auth file holding a plain password instead of a hash is refused (78) without echoing it.
BOOST_FIXTURE_TEST_CASE(auth_without_tls_off_loopback_is_refused, fixture) {
    auto& refused = spawn(
        consume_args({"--health-listen", "0.0.0.0:0", "--health-basic-auth-file", auth_file}), pg_env());
    BOOST_TEST(wait_exit(refused, seconds(20)) == 64, refused.err());
    BOOST_TEST(has(refused.err(), "clear text"), refused.err());
    BOOST_TEST(has(refused.err(), "--health-basic-auth-over-http"), refused.err());

    // The same settings from the environment, as a ConfigMap gives them: a configuration error, 78.
    auto& from_env = spawn(consume_args({}), {{"CHARGEGUARD_PG_DSN", pg_env().begin()->second},
                                              {"CHARGEGUARD_HEALTH_LISTEN", "0.0.0.0:0"},
                                              {"CHARGEGUARD_HEALTH_BASIC_AUTH_FILE", auth_file}});
    BOOST_TEST(wait_exit(from_env, seconds(20)) == 78, from_env.err());
    BOOST_TEST(has(from_env.err(), "CHARGEGUARD_HEALTH_BASIC_AUTH_FILE=" + auth_file), from_env.err());
    BOOST_TEST(has(from_env.err(), "clear text"), from_env.err());

    auto& acknowledged = spawn(consume_args({"--health-listen", "0.0.0.0:0", "--health-basic-auth-file",
                                             auth_file, "--health-basic-auth-over-http"}),
                               pg_env());
    auto open_port = health_port(acknowledged);
    auto full = get(origin("http", open_port), "/config", basic(scrape_user, scrape_password));
    BOOST_TEST(full.status == 200);
    BOOST_TEST(has(full.body, R"("pg":"host=127.0.0.1:1 dbname=billing user=chargeguard")"), full.body);

    // Off loopback without basic auth /config leaves out where the dependencies live, as /readyz does.
    auto& unguarded = spawn(consume_args({"--health-listen", "0.0.0.0:0"}), pg_env());
    auto redacted = get(origin("http", health_port(unguarded)), "/config");
    BOOST_TEST(redacted.status == 200);
    BOOST_TEST(has(redacted.body, R"x("pg":"(redacted)")x"), redacted.body);
    BOOST_TEST(has(redacted.body, R"x("nsqd_tcp_addresses":"(redacted)")x"), redacted.body);
    BOOST_TEST(!has(redacted.body, "dbname=billing"), redacted.body);
    BOOST_TEST(!has(redacted.body, "127.0.0.1:1"), redacted.body);
    BOOST_TEST(has(redacted.body, R"("topic":"billing")"), redacted.body);
    auto& with_tls = spawn(consume_args({"--health-listen", "0.0.0.0:0", "--health-basic-auth-file",
                                         auth_file, "--health-tls-cert-file", test::cert("server.pem"),
                                         "--health-tls-key-file", test::cert("server.key")}),
                           pg_env());
    auto port = health_port(with_tls);
    BOOST_TEST(get(origin("https", port), "/config").status == 401);

    auto plain_file = write("plain_users", scrape_user + ":" + scrape_password + "\n");
    auto& plain = spawn(
        consume_args({"--health-listen", "127.0.0.1:0", "--health-basic-auth-file", plain_file}), pg_env());
    BOOST_TEST(wait_exit(plain, seconds(20)) == 78, plain.err());
    BOOST_TEST(has(plain.err(), "line 1: not a bcrypt, yescrypt or SHA-crypt hash"), plain.err());
    BOOST_TEST(!has(plain.err(), scrape_password), plain.err());

    auto& half = spawn(
        consume_args({"--health-listen", "127.0.0.1:0", "--health-tls-cert-file", test::cert("server.pem")}),
        pg_env());
    BOOST_TEST(wait_exit(half, seconds(20)) == 64, half.err());
    BOOST_TEST(has(half.err(), "--health-tls-cert-file and --health-tls-key-file go together"), half.err());
}
