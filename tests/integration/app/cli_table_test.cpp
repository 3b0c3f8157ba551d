// The built `chargeguard` executable, table-driven: argv + environment → exit code + a phrase on its output.
// Every bad input of the operator CLI (durations, exit codes, sanity limits, secret files, reconcile's
// checks, explain's arguments) and the environment-scoping cases: with the shipped ConfigMap's variables
// exported, no tool takes a selector (tail's channel, replay's reason, reconcile --publish) from them.
// Every case fails before anything connects, so none needs a server.
#define BOOST_TEST_MODULE cli_table
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using env_map = std::map<std::string, std::string>;

// The data of the shipped ConfigMap (deploy/kubernetes/chargeguard.yaml), as a debug pod with the same
// envFrom has it; kept in step with that file by hand.
const env_map configmap = {
    {"CHARGEGUARD_TOPIC", "billing"},
    {"CHARGEGUARD_CHANNEL", "chargeguard"},
    {"CHARGEGUARD_LOOKUPD_HTTP_ADDRESS", "nsqlookupd.billing.svc.cluster.local:4161"},
    {"CHARGEGUARD_MAX_IN_FLIGHT", "200"},
    {"CHARGEGUARD_MSG_TIMEOUT", "60s"},
    {"CHARGEGUARD_SHUTDOWN_TIMEOUT", "30"},
    {"CHARGEGUARD_KEY_NAMESPACE", "billing-prod"},
    {"CHARGEGUARD_HEALTH_LISTEN", "0.0.0.0:9180"},
    {"PGHOST", "postgres.billing.svc.cluster.local"},
    {"PGPORT", "5432"},
    {"PGUSER", "chargeguard"},
    {"PGDATABASE", "billing"},
    {"PGSSLMODE", "require"},
    {"CHARGEGUARD_STRIPE_KEY_FILE", "/run/secrets/chargeguard/stripe_api_key"},
};

env_map with(env_map base, const env_map& more) {
    for (const auto& [k, v] : more) base[k] = v;
    return base;
}

std::string exe() {
    const char* p = std::getenv("CHARGEGUARD_EXE");
    BOOST_REQUIRE_MESSAGE(p, "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

std::string scratch() {
    static std::string dir = [] {
        std::string t = "/tmp/cg-cli-table-XXXXXX";
        BOOST_REQUIRE(::mkdtemp(t.data()) != nullptr);
        return t;
    }();
    return dir;
}

std::string write_file(const std::string& name, const std::string& content) {
    auto path = scratch() + "/" + name;
    std::ofstream(path) << content;
    return path;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct outcome {
    int code = -1;
    std::string output;  // stdout then stderr
};

// Runs the executable with exactly `env` (plus PATH), stdin from /dev/null, and waits for SIGCHLD (at most a
// minute: every case fails during validation; a hang is a failure, reported with its output).
outcome run(const std::vector<std::string>& args, const env_map& env) {
    static int n = 0;
    auto out = scratch() + "/out" + std::to_string(++n), err = scratch() + "/err" + std::to_string(n);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<std::string> argv_s = {exe()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s = {"PATH=/usr/bin:/bin"};
    for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &chld, &old);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    BOOST_REQUIRE(rc == 0);
    int status = 0;
    timespec limit{60, 0};
    bool exited = false;
    while (!exited) {
        if (::waitpid(pid, &status, WNOHANG) == pid) {
            exited = true;
            break;
        }
        if (::sigtimedwait(&chld, nullptr, &limit) < 0 && errno == EAGAIN) break;
    }
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    outcome o;
    o.code = !exited ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.output = slurp(out) + slurp(err);
    return o;
}

struct row {
    std::string what;
    std::vector<std::string> args;
    env_map env;
    int code;
    std::string phrase;      // must appear in the output
    std::string not_phrase;  // must not (empty: no check)
};

void check(const std::vector<row>& rows) {
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT(r.what) {
            auto o = run(r.args, r.env);
            BOOST_TEST(o.code == r.code, "exit " << o.code << ", output: " << o.output);
            BOOST_TEST(o.output.find(r.phrase) != std::string::npos,
                       "missing '" << r.phrase << "' in: " << o.output);
            if (!r.not_phrase.empty())
                BOOST_TEST(o.output.find(r.not_phrase) == std::string::npos,
                           "unexpected '" << r.not_phrase << "' in: " << o.output);
            BOOST_TEST(o.code < 100, "a raw CLI11 exit code leaked");
        }
    }
}

const std::string nowhere = "127.0.0.1:1";  // refused: nothing below may get as far as connecting
const env_map stripe_key = {{"STRIPE_API_KEY", "sk_test_cli_table_0123456789"}};
// The ConfigMap's key file, present: a readable key in the scratch directory.
env_map configmap_with_key() {
    static std::string path = [] {
        auto p = scratch() + "/stripe_api_key";
        std::ofstream(p) << "sk_test_cli_table_0123456789\n";
        ::chmod(p.c_str(), 0600);
        return p;
    }();
    return with(configmap, {{"CHARGEGUARD_STRIPE_KEY_FILE", path}});
}

// consume's argv up to the point each row adds the flag under test; every other flag valid.
std::vector<std::string> consume(std::vector<std::string> more) {
    std::vector<std::string> a = {"consume", "--topic", "t", "--channel", "c", "--nsqd-tcp-address", nowhere};
    a.insert(a.end(), more.begin(), more.end());
    return a;
}

}  // namespace

BOOST_AUTO_TEST_CASE(durations_take_one_syntax_and_errors_say_where_the_value_came_from) {
    check({
        {"not a duration on the command line", consume({"--shutdown-timeout", "abc"}), stripe_key, 64,
         "--shutdown-timeout abc: not a duration", "--shutdown-timeout: --shutdown-timeout"},
        {"not a duration from the environment", consume({}),
         with(stripe_key, {{"CHARGEGUARD_SHUTDOWN_TIMEOUT", "abc"}}), 78,
         "CHARGEGUARD_SHUTDOWN_TIMEOUT=abc: not a duration", ""},
        {"an NSQ duration from the environment out of range", consume({}),
         with(stripe_key, {{"CHARGEGUARD_MSG_TIMEOUT", "500ms"}}), 78,
         "CHARGEGUARD_MSG_TIMEOUT=500ms: out of range", ""},
        {"an NSQ duration on the command line", consume({"--msg-timeout", "soon"}), stripe_key, 64,
         "--msg-timeout soon: not a duration", ""},
        // 0 would leave the timeout to nsqd while TOUCH and the sweeper assume one: refused, not documented.
        {"a zero message timeout on the command line", consume({"--msg-timeout", "0"}), stripe_key, 64,
         "--msg-timeout 0: 0 is not accepted", ""},
        {"a zero message timeout as a Go duration", consume({"--msg-timeout", "0s"}), stripe_key, 64,
         "--msg-timeout 0s: 0 is not accepted", ""},
        {"a zero message timeout from the environment", consume({}),
         with(stripe_key, {{"CHARGEGUARD_MSG_TIMEOUT", "0"}}), 78,
         "CHARGEGUARD_MSG_TIMEOUT=0: 0 is not accepted", ""},
        {"a message timeout above nsqd's maximum", consume({"--msg-timeout", "16m"}), stripe_key, 64,
         "--msg-timeout 16m: out of range: 1s .. 15m", ""},
        // Go durations for runtime/PostgreSQL/Stripe flags and bare seconds for NSQ ones are accepted: the
        // run gets as far as the bad --health-listen, checked last.
        {"both syntaxes accepted everywhere",
         consume({"--shutdown-timeout", "1m30s", "--msg-timeout", "60", "--pg-query-timeout", "250ms",
                  "--stripe-request-timeout", "30s", "--lease", "120", "--health-listen", "bogus"}),
         stripe_key, 64, "--health-listen bogus: bad address (expected host:port)", "chargeguard.net"},
        {"a duration out of range", consume({"--shutdown-timeout", "2h"}), stripe_key, 64,
         "--shutdown-timeout 2h: out of range 0s .. 1h", ""},
        {"the processing poll bound out of range", consume({"--processing-poll-after", "0s"}), stripe_key, 64,
         "--processing-poll-after 0s: must be between 1s and 168h", ""},
        {"probe takes a Go duration",
         {"probe", "--timeout", "2s", "http://" + nowhere + "/healthz"},
         {},
         1,
         "probe:",
         ""},
        {"migrate's lock timeout",
         {"migrate", "--lock-timeout", "forever"},
         {},
         64,
         "--lock-timeout forever: not a duration",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(exit_codes_are_the_table_and_cli11_codes_never_leak) {
    check({
        {"no subcommand", {}, {}, 64, "A subcommand is required", ""},
        {"an unknown flag", {"tail", "--topic", "t", "--bogus"}, {}, 64, "--bogus", ""},
        {"a missing required flag",
         {"publish", "--topic", "t", "f.jsonl"},
         {},
         64,
         "--nsqd-tcp-address is required",
         ""},
        {"a malformed number", {"tail", "--topic", "t", "--max-in-flight", "many"}, {}, 64, "many", ""},
        {"help is 0 and shows the exit-code table", {"--help"}, {}, 0, "78  configuration error", ""},
        {"--log-level after the subcommand", consume({"--log-level", "debug", "--shutdown-timeout", "x"}),
         stripe_key, 64, "--shutdown-timeout x: not a duration", ""},
        {"--log-level before the subcommand", {"--log-level", "loud", "tail"}, {}, 64, "loud", ""},
        {"a malformed DSN says so once", consume({"--pg-dsn", "nonsense"}), stripe_key, 64,
         "--pg-dsn: ", "--pg-dsn: --pg-dsn"},
        {"a bad nsqd address leaks no category",
         {"tail", "--topic", "t", "--nsqd-tcp-address", "nsqd-without-port"},
         {},
         64,
         "--nsqd-tcp-address nsqd-without-port: bad address",
         "chargeguard.net:"},
    });
}

BOOST_AUTO_TEST_CASE(sanity_limits) {
    auto dir = scratch() + "/secret-dir";
    ::mkdir(dir.c_str(), 0700);
    auto empty = write_file("empty-secret", "\n");
    auto two_lines = write_file("two-line-secret", "first\nsecond-secret-line\n");
    check({
        {"max-in-flight above nsqd's max-rdy-count",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--max-in-flight", "100000"},
         {},
         64,
         "--max-in-flight 100000: above 2500",
         ""},
        {"the acknowledgement is never taken from the environment",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--max-in-flight", "3000"},
         {{"CHARGEGUARD_MAX_IN_FLIGHT_ABOVE_NSQD_DEFAULT", "true"}},
         64,
         "above 2500",
         ""},
        {"nsqd and lookupd together",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--lookupd-http-address", nowhere},
         {},
         64,
         "exclude each other",
         ""},
        {"a Stripe pool above its cap", consume({"--stripe-max-connections", "5000"}), stripe_key, 64,
         "above --stripe-connection-cap", ""},
        {"an AUTH secret file that is a directory",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", dir},
         {},
         78,
         "is a directory",
         ""},
        {"an AUTH secret file that is missing",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", dir + "/none"},
         {},
         78,
         "no such file",
         ""},
        {"an AUTH secret file that is empty",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", empty},
         {},
         78,
         "is empty",
         ""},
        {"an AUTH secret file of two lines",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", two_lines},
         {},
         78,
         "more than one line",
         "second-secret"},
        {"an AUTH secret file from the environment names the variable",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere},
         {{"CHARGEGUARD_NSQ_AUTH_SECRET_FILE", dir}},
         78,
         "CHARGEGUARD_NSQ_AUTH_SECRET_FILE=" + dir + ": is a directory",
         ""},
    });
    auto not_pem = write_file("not-pem.key", "just some text\n");
    auto cert = write_file("cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    check({
        {"a proxy TLS key that is a directory",
         {"proxy", "--tls-cert", cert, "--tls-key", dir},
         stripe_key,
         78,
         "--tls-key " + dir + ": is a directory",
         ""},
        {"a proxy TLS key that is not PEM",
         {"proxy", "--tls-cert", cert, "--tls-key", not_pem},
         stripe_key,
         78,
         "not a PEM private key",
         "just some text"},
        {"a proxy duration in Go syntax, then a bad one",
         {"proxy", "--upstream-timeout", "45s", "--read-timeout", "x"},
         stripe_key,
         64,
         "--read-timeout x: not a duration",
         ""},
        {"a proxy forwarding bound past its range",
         {"proxy", "--max-forwarding", "70000"},
         stripe_key,
         64,
         "--max-forwarding: Value 70000 not in range",
         ""},
        // CLI11's own range check, attributed to the variable the value came from (a configuration error).
        {"a proxy forwarding bound from the environment, past its range",
         {"proxy"},
         with(stripe_key, {{"CHARGEGUARD_MAX_FORWARDING", "-1"}}),
         78,
         "CHARGEGUARD_MAX_FORWARDING: Value -1 not in range",
         ""},
    });
    if (::geteuid() != 0) {
        auto locked = write_file("locked-secret", "s3cret\n");
        ::chmod(locked.c_str(), 0);
        check({{"an unreadable AUTH secret file",
                {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", locked},
                {},
                78,
                "permission denied",
                ""}});
    }
}

BOOST_AUTO_TEST_CASE(the_configmap_environment_supplies_no_selector) {
    auto none = write_file("none.jsonl", "");
    check({
        {"tail refuses the sidecar's channel",
         {"tail", "--topic", "billing", "--channel", "chargeguard"},
         configmap,
         64,
         "the sidecar's channel",
         ""},
        {"even with the acknowledgement",
         {"tail", "--topic", "billing", "--channel", "chargeguard", "--take-from-channel"},
         configmap,
         64,
         "the sidecar's channel",
         ""},
        {"tail refuses any durable channel without the acknowledgement",
         {"tail", "--topic", "billing", "--channel", "audit"},
         configmap,
         64,
         "--take-from-channel",
         ""},
        {"tail takes no topic from the environment", {"tail"}, configmap, 64, "--topic is required", ""},
        {"replay takes no reason from the environment",
         {"dead-letters", "replay", "--nsqd-tcp-address", nowhere},
         with(configmap, {{"CHARGEGUARD_REASON", "stripe"}}),
         64,
         "give letter IDs or --reason",
         ""},
        {"retry-declined takes what it retries from the command line only",
         {"retry-declined", "--reason", "card updated", "--nsqd-tcp-address", nowhere},
         with(configmap,
              {{"CHARGEGUARD_CUSTOMER", "c"}, {"CHARGEGUARD_PERIOD", "p"}, {"CHARGEGUARD_ALL", "true"}}),
         64,
         "give one of --customer C --period P, --key K, --period P --all",
         ""},
        {"retry-declined takes no reason from the environment",
         {"retry-declined", "--customer", "c", "--period", "p", "--nsqd-tcp-address", nowhere},
         with(configmap, {{"CHARGEGUARD_REASON", "from-env"}}),
         64,
         "--reason is required",
         ""},
        {"replay takes no ids from the environment",
         {"dead-letters", "replay", "--nsqd-tcp-address", nowhere},
         with(configmap, {{"CHARGEGUARD_ID", "1"}, {"CHARGEGUARD_ALL", "true"}}),
         64,
         "give letter IDs",
         ""},
        // --publish from the environment would stop at "--publish needs …"; without it the run reaches the
        // empty expected set.
        {"reconcile takes no --publish from the environment",
         {"reconcile", "--expected", none, "--period", "2026-11"},
         with(configmap_with_key(), {{"CHARGEGUARD_PUBLISH", "true"}}),
         2,
         "holds no events",
         "--publish"},
        {"vault takes no key name from the environment",
         {"vault", "issue", "--period", "2026-11", "--currency", "usd", "--expected-total-cents", "100"},
         with(configmap, {{"CHARGEGUARD_NAME", "from-env"}}),
         64,
         "--name is required",
         ""},
        // The refund policy is given on the command line, never taken from the environment or a default.
        {"vault set-policy takes no policy from the environment",
         {"vault", "set-policy", "vk_0123456789abcdef"},
         with(configmap, {{"CHARGEGUARD_REFUNDS_REOPEN_CAP", "true"}}),
         64,
         "--refunds-reopen-cap is required",
         ""},
        {"vault set-policy takes true or false",
         {"vault", "set-policy", "vk_0123456789abcdef", "--refunds-reopen-cap=maybe"},
         configmap,
         64,
         "Could not convert: --refunds-reopen-cap = maybe",
         ""},
        // Topic, channel, lookupd, "60s", "30" and the key file all come from the ConfigMap: the run gets as
        // far as the bad --health-listen, checked last.
        {"consume reads the ConfigMap (a service)",
         {"consume", "--health-listen", "bogus"},
         configmap_with_key(),
         64,
         "--health-listen bogus",
         ""},
        {"a command-line nsqd replaces the environment's lookupd",
         {"tail", "--topic", "billing", "--nsqd-tcp-address", nowhere, "--max-in-flight", "3000"},
         configmap,
         64,
         "--max-in-flight 3000: above 2500",
         "exclude each other"},
        {"a bad key namespace from the environment",
         {"explain", "--customer", "c", "--period", "p"},
         with(configmap, {{"CHARGEGUARD_KEY_NAMESPACE", "bad ns!"}}),
         78,
         "CHARGEGUARD_KEY_NAMESPACE=bad ns!",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(reconcile_refuses_a_check_that_checks_nothing) {
    auto events =
        write_file("recon.jsonl",
                   "{\"customer_id\":\"acme-42\",\"billing_period\":\"2026-11\",\"amount_cents\":1999,"
                   "\"currency\":\"usd\",\"stripe_customer_id\":\"cus_1\"}\n");
    auto none = write_file("recon-none.jsonl", "");
    check({
        {"an empty expected set",
         {"reconcile", "--expected", none, "--period", "2026-11"},
         stripe_key,
         2,
         "holds no events",
         ""},
        {"a period not of the events' form",
         {"reconcile", "--expected", events, "--period", "November"},
         stripe_key,
         2,
         "--period November does not have the form of the events' periods (2026-11)",
         ""},
        {"no event of the period",
         {"reconcile", "--expected", events, "--period", "2026-12"},
         stripe_key,
         2,
         "has no event of period 2026-12 (its periods: 2026-11)",
         ""},
        {"no event of the customer",
         {"reconcile", "--expected", events, "--period", "2026-11", "--customer", "nobody"},
         stripe_key,
         2,
         "no event of customer nobody in period 2026-11",
         ""},
        {"a period of impossible characters",
         {"reconcile", "--expected", events, "--period", "2026/11"},
         stripe_key,
         64,
         "--period 2026/11: not 1-64 characters",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(explain_refuses_unclear_subjects) {
    check({
        {"nothing on stdin", {"explain"}, {}, 64, "stdin: not a billing event", ""},
        {"a key that is not one", {"explain", "--key", "xyz"}, {}, 64, "--key xyz: not a billing key", ""},
        {"a key and a customer",
         {"explain", "--key", "0123456789abcdef0123456789abcdef", "--customer", "c", "--period", "p"},
         {},
         64,
         "not both",
         ""},
        {"a customer without a period", {"explain", "--customer", "c"}, {}, 64, "go together", ""},
        {"a Stripe customer without a period",
         {"explain", "--stripe-customer", "cus_1"},
         {},
         64,
         "--stripe-customer needs --period",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(webhooks_takes_its_secrets_from_a_file_or_the_environment_only) {
    auto not_whsec = write_file("hooks-not-whsec", "sk_test_not_a_webhook_secret\n");
    auto three = write_file("hooks-three", "whsec_first_one\nwhsec_second_one\nwhsec_third_one\n");
    auto blank = write_file("hooks-blank", "\n  \n");
    auto one = write_file("hooks-one", "whsec_only_one_secret\n");
    check({
        {"no secret at all", {"webhooks"}, {}, 64, "--webhook-secret-file or CHARGEGUARD_WEBHOOK_SECRET", ""},
        {"an API key in the secret file",
         {"webhooks", "--webhook-secret-file", not_whsec},
         {},
         78,
         "is not a Stripe endpoint secret (whsec_",
         "sk_test_not_a_webhook_secret"},
        {"three secrets",
         {"webhooks", "--webhook-secret-file", three},
         {},
         78,
         "at most two secrets",
         "whsec_third"},
        {"a blank secret file", {"webhooks", "--webhook-secret-file", blank}, {}, 78, "is empty", ""},
        {"a bad secret from the environment names the variable",
         {"webhooks"},
         {{"CHARGEGUARD_WEBHOOK_SECRET", "rk_live_oops"}},
         78,
         "CHARGEGUARD_WEBHOOK_SECRET: line 1 is not a Stripe endpoint secret",
         "rk_live_oops"},
        {"a tolerance outside 1s..24h",
         {"webhooks", "--webhook-secret-file", one, "--tolerance", "48h"},
         {},
         64,
         "--tolerance 48h: must be between 1s and 24h",
         ""},
        {"no secret flag on the command line", {"webhooks", "--webhook-secret", "whsec_x"}, {}, 64, "", ""},
    });
}

// Whatever an operator types where the secret's file belongs, or as a flag of its own, no message repeats
// the secret: every wrong form names the flag instead.
BOOST_AUTO_TEST_CASE(no_message_repeats_a_webhook_secret_typed_in_the_wrong_place) {
    const std::string s = "whsec_SuperSecretValue0123456789";
    auto one = write_file("hooks-ok", "whsec_only_one_secret\n");
    auto with_secret_line = write_file("hooks-bad-line", "not-a-secret " + s + "\n");
    check({
        {"--webhook-secret VALUE", {"webhooks", "--webhook-secret", s}, {}, 64, "--webhook-secret", s},
        {"--webhook-secret=VALUE", {"webhooks", "--webhook-secret=" + s}, {}, 64, "--webhook-secret", s},
        {"--webhook-secret with a valid file too",
         {"webhooks", "--webhook-secret-file", one, "--webhook-secret", s},
         {},
         64,
         "is not accepted",
         s},
        {"--webhook-secret-file VALUE",
         {"webhooks", "--webhook-secret-file", s},
         {},
         78,
         "--webhook-secret-file: the value is a secret",
         s},
        {"--webhook-secret-file=VALUE",
         {"webhooks", "--webhook-secret-file=" + s},
         {},
         78,
         "--webhook-secret-file: the value is a secret",
         s},
        {"a path ending in the secret",
         {"webhooks", "--webhook-secret-file", "/run/secrets/" + s},
         {},
         78,
         "--webhook-secret-file",
         s},
        {"CHARGEGUARD_WEBHOOK_SECRET_FILE=VALUE",
         {"webhooks"},
         {{"CHARGEGUARD_WEBHOOK_SECRET_FILE", s}},
         78,
         "the value is a secret",
         s},
        {"the secret as a bare argument", {"webhooks", s}, {}, 64, "[redacted]", s},
        {"the secret after an unknown flag", {"webhooks", "--secret", s}, {}, 64, "", s},
        {"the secret as another flag's value",
         {"webhooks", "--webhook-secret-file", one, "--tolerance", s},
         {},
         64,
         "--tolerance [redacted]",
         s},
        {"a file whose line holds it",
         {"webhooks", "--webhook-secret-file", with_secret_line},
         {},
         78,
         "is not a Stripe endpoint secret",
         s},
        {"the environment variable malformed around it",
         {"webhooks"},
         {{"CHARGEGUARD_WEBHOOK_SECRET", "x " + s}},
         78,
         "CHARGEGUARD_WEBHOOK_SECRET: line 1",
         s},
    });
}
