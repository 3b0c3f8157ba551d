// The health listener of the built binary: GET /config (the effective configuration, the same JSON
// `consume --validate` prints, never a secret), HTTPS on it, basic auth guarding /metrics and /config while
// the probes' routes stay open, the refusal of basic auth over plain http off loopback, and `chargeguard
// probe` reaching such a listener. consume runs with nothing to connect to (PostgreSQL, nsqd and Stripe are
// refused ports): its health listener serves before any of them answers, so no server is needed.
#define BOOST_TEST_MODULE health_listener
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/health_auth.hpp"
#include "http/client.hpp"
#include "net/tls.hpp"
#include "support/run_async.hpp"
#include "support/test_certs.hpp"

using namespace cg;
using namespace std::chrono;
namespace fs = std::filesystem;

namespace {

const std::string stripe_key = "sk_test_health_listener_0123456789";
const std::string pg_password = "pg-password-never-shown-4711";
const std::string scrape_user = "prometheus", scrape_password = "scrape-pass-never-shown-9";

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

std::string exe() {
    const char* p = std::getenv("CHARGEGUARD_EXE");
    BOOST_TEST_REQUIRE(p != nullptr, "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

struct child {
    pid_t pid = -1;
    std::string out_path, err_path;
    std::string out() const { return slurp(out_path); }
    std::string err() const { return slurp(err_path); }
};

// The scratch files and the children of one test; the children are killed and the files removed at the end.
struct fixture {
    std::string dir;
    std::vector<child> children;
    std::string key_file, auth_file, credentials_file, wrong_credentials_file, auth_hash;

    fixture() {
        dir = "/tmp/cg-health-listener-XXXXXX";
        BOOST_TEST_REQUIRE(::mkdtemp(dir.data()) != nullptr);
        key_file = write("stripe_api_key", stripe_key + "\n");
        auto setting = app::bcrypt_setting_for_tests();
        BOOST_TEST_REQUIRE(!setting.empty());
        auth_hash = app::crypt_password(scrape_password, setting);
        BOOST_TEST_REQUIRE(auth_hash.rfind("$2b$", 0) == 0);
        auth_file = write("health_users", "# scrapers\n" + scrape_user + ":" + auth_hash + "\n");
        credentials_file = write("health_credentials", scrape_user + ":" + scrape_password + "\n");
        wrong_credentials_file = write("wrong_credentials", scrape_user + ":not-the-password\n");
    }
    ~fixture() {
        for (auto& c : children)
            if (c.pid > 0) {
                ::kill(c.pid, SIGKILL);
                ::waitpid(c.pid, nullptr, 0);
            }
        if (!std::getenv("CG_KEEP_LOGS")) fs::remove_all(dir);
    }

    std::string write(const std::string& name, const std::string& content) {
        auto p = dir + "/" + name;
        std::ofstream(p) << content;
        ::chmod(p.c_str(), 0600);
        return p;
    }

    // Starts the binary with `args`, the environment this process has plus `env`.
    child& spawn(std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
        child c;
        auto n = std::to_string(children.size());
        c.out_path = dir + "/child-" + n + ".out";
        c.err_path = dir + "/child-" + n + ".err";
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_addopen(&fa, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        args.insert(args.begin(), exe());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::vector<std::string> envs;
        for (char** e = environ; *e; ++e) {
            std::string kv = *e;
            if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
        }
        for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
        std::vector<char*> envp;
        for (auto& e : envs) envp.push_back(e.data());
        envp.push_back(nullptr);
        int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&fa);
        BOOST_TEST_REQUIRE(rc == 0);
        children.push_back(std::move(c));
        return children.back();
    }

    // The exit code, or -1 when it did not exit within `limit` (then it is killed).
    static int wait_exit(child& c, milliseconds limit) {
        int status = 0;
        auto end = steady_clock::now() + limit;
        while (::waitpid(c.pid, &status, WNOHANG) != c.pid) {
            if (steady_clock::now() > end) {
                ::kill(c.pid, SIGKILL);
                ::waitpid(c.pid, &status, 0);
                c.pid = -1;
                return -1;
            }
            std::this_thread::sleep_for(milliseconds(5));
        }
        c.pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

    // The port of the child's health listener, from its "health server listening" line (it listens on port
    // 0); fails the test when the child exits or never says.
    static unsigned short health_port(child& c) {
        static const std::regex line(R"("msg":"health server listening".*"port":(\d+))");
        auto end = steady_clock::now() + seconds(20);
        while (steady_clock::now() < end) {
            std::smatch m;
            auto err = c.err();
            if (std::regex_search(err, m, line)) return static_cast<unsigned short>(std::stoi(m[1]));
            int status = 0;
            BOOST_TEST_REQUIRE(::waitpid(c.pid, &status, WNOHANG) == 0, "the child exited: " << err);
            std::this_thread::sleep_for(milliseconds(10));
        }
        BOOST_FAIL("no health listener within 20 s: " << c.err());
        return 0;
    }

    // consume with nothing reachable: PostgreSQL (with a password, from the environment as a deployment
    // gives it), nsqd and Stripe on refused ports; the Stripe key from a file.
    std::vector<std::string> consume_args(std::vector<std::string> more) const {
        std::vector<std::string> a = {"consume",
                                      "--topic",
                                      "billing",
                                      "--channel",
                                      "chargeguard",
                                      "--nsqd-tcp-address",
                                      "127.0.0.1:1",
                                      "--stripe-key-file",
                                      key_file,
                                      "--stripe-api-base",
                                      "https://127.0.0.1:1",
                                      "--stripe-ca-file",
                                      test::cert("ca.pem"),
                                      "--max-loop-lag",
                                      "5"};
        a.insert(a.end(), more.begin(), more.end());
        return a;
    }
    static std::map<std::string, std::string> pg_env() {
        return {{"CHARGEGUARD_PG_DSN", "host=127.0.0.1 port=1 dbname=billing user=chargeguard password=" +
                                           pg_password + " connect_timeout=1"}};
    }
};

struct answer {
    bool ok = false;
    int status = 0;
    std::string body, www_authenticate, content_type, error;
};

// One GET on `origin` (http:// or https:// verified against the test CA), with `authorization` when given.
answer get(const std::string& origin, const std::string& path, const std::string& authorization = "") {
    asio::io_context io;
    http::client_options o;
    o.connect_timeout = seconds(5);
    o.request_timeout = seconds(10);
    if (origin.rfind("https://", 0) == 0) {
        auto tls = net::make_tls_client_context({test::cert("ca.pem")});
        BOOST_TEST_REQUIRE(tls.has_value());
        o.tls = *tls;
    }
    return test::run_async(io, [&]() -> asio::awaitable<answer> {
        auto cl = http::client::create(io.get_executor(), origin, o, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        http::request req;
        req.target = path;
        if (!authorization.empty()) req.headers.add("Authorization", authorization);
        auto r = co_await (*cl)->request(std::move(req));
        answer a;
        a.ok = r.ok();
        if (!r.ok()) {
            a.error = r.err.describe();
            co_return a;
        }
        a.status = r.resp.status;
        a.body = r.resp.body;
        a.www_authenticate = std::string(r.resp.headers.get("WWW-Authenticate").value_or(""));
        a.content_type = std::string(r.resp.headers.get("Content-Type").value_or(""));
        co_return a;
    });
}

std::string basic(const std::string& user, const std::string& password) {
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string in = user + ":" + password, out;
    for (std::size_t i = 0; i < in.size(); i += 3) {
        unsigned v = static_cast<unsigned char>(in[i]) << 16;
        if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
        if (i + 2 < in.size()) v |= static_cast<unsigned char>(in[i + 2]);
        out += b64[(v >> 18) & 63];
        out += b64[(v >> 12) & 63];
        out += i + 1 < in.size() ? b64[(v >> 6) & 63] : '=';
        out += i + 2 < in.size() ? b64[v & 63] : '=';
    }
    return "Basic " + out;
}

std::string origin(const char* scheme, unsigned short port) {
    return std::string(scheme) + "://127.0.0.1:" + std::to_string(port);
}

}  // namespace

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
