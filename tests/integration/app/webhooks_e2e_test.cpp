// `chargeguard webhooks` end to end: the built binary on a scratch database (--migrate), its secret from
// CHARGEGUARD_WEBHOOK_SECRET, deliveries over HTTP from this thread (the receiver is another process), and
// its /metrics. Skips without PGHOST.
#define BOOST_TEST_MODULE webhooks_e2e
#define BOOST_TEST_NO_MAIN
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "core/bytes.hpp"
#include "integration/pg/support.hpp"
#include "stripe/webhook_signature.hpp"
#include "support/pg_main.hpp"
#include "support/raw_http.hpp"

extern char** environ;

using namespace cg;
using namespace std::chrono_literals;

namespace {

const std::string secret = "whsec_e2e_current";

std::string slurp_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::int64_t now_unix() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string post(const std::string& body, const std::string& signature) {
    return "POST /stripe/webhooks HTTP/1.1\r\nHost: test\r\nContent-Type: "
           "application/json\r\nStripe-Signature: " +
           signature + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string sign(const std::string& body, const std::string& key, std::int64_t t) {
    return "t=" + std::to_string(t) + ",v1=" + to_hex(stripe::compute_signature(key, t, body));
}

struct receiver_process {
    pid_t pid = -1;
    std::string log_path = "/tmp/cg-webhooks-e2e-" + std::to_string(::getpid()) + ".err";

    explicit receiver_process(const std::string& dbname) {
        ::setenv("CHARGEGUARD_WEBHOOK_SECRET", secret.c_str(), 1);  // inherited; never on argv
        const char* exe = std::getenv("CHARGEGUARD_EXE");
        BOOST_TEST_REQUIRE(exe != nullptr, "CHARGEGUARD_EXE not set (meson sets it)");
        std::vector<std::string> args = {
            exe,           "webhooks",         "--listen", "127.0.0.1:0", "--health-listen",
            "127.0.0.1:0", "--max-body-bytes", "2048",     "--pg-dsn",    "dbname=" + dbname,
            "--migrate"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        BOOST_TEST_REQUIRE(rc == 0);
    }
    ~receiver_process() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
        if (!std::getenv("CG_KEEP_LOGS")) ::unlink(log_path.c_str());
    }

    // The port of the log line `msg`, once the process wrote it (polls its log; bounded).
    unsigned short port_of(const std::string& msg) {
        const std::regex re("\"msg\":\"" + msg + "\"[^\\n]*\"port\":([0-9]+)");
        for (auto end = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < end;) {
            std::smatch m;
            auto log = slurp_file(log_path);
            if (std::regex_search(log, m, re)) return static_cast<unsigned short>(std::stoi(m[1]));
            BOOST_TEST_REQUIRE(::waitpid(pid, nullptr, WNOHANG) == 0, "receiver exited: " << log);
            std::this_thread::sleep_for(10ms);
        }
        BOOST_FAIL("no '" + msg + "' in: " + slurp_file(log_path));
        return 0;
    }

    int terminate() {
        ::kill(pid, SIGTERM);
        int status = 0;
        ::waitpid(pid, &status, 0);
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
};

double metric(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    BOOST_TEST_REQUIRE(at != std::string::npos, series << " missing in " << text);
    return std::stod(text.substr(at + series.size() + 2));
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_binary_records_signed_deliveries_once_and_refuses_the_rest) {
    test::scratch_db db("webhooks_e2e");
    receiver_process rx(db.name);
    const auto port = rx.port_of("webhook receiver listening");
    const auto health = rx.port_of("health server listening");

    const std::string body =
        R"({"id":"evt_e2e_1","object":"event","type":"payment_intent.payment_failed",)"
        R"("created":)" +
        std::to_string(now_unix()) +
        R"(,"livemode":false,"data":{"object":{"id":"pi_e2e_1","object":"payment_intent"}}})";
    test::raw_http c(port);  // one keep-alive connection, as Stripe uses
    auto r = c.exchange(post(body, sign(body, secret, now_unix())));
    BOOST_TEST(r.status == 200, r.body);
    r = c.exchange(post(body, sign(body, secret, now_unix())));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(r.body.find("duplicate") != std::string::npos, r.body);
    r = c.exchange(post(body + " ", sign(body, secret, now_unix())));
    BOOST_TEST(r.status == 400);
    r = c.exchange(post(body, sign(body, "whsec_not_ours", now_unix())));
    BOOST_TEST(r.status == 400);
    r = c.exchange(post(body, sign(body, secret, now_unix() - 3600)));
    BOOST_TEST(r.status == 400);
    const std::string big(3000, ' ');
    r = c.exchange(post(big, sign(big, secret, now_unix())));
    BOOST_TEST(r.status == 413);
    r = test::raw_http(port).get("/stripe/webhooks");
    BOOST_TEST(r.status == 405);

    auto m = test::http_get(health, "/metrics").body;
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="recorded"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="duplicate"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="bad_signature"})") == 2);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="stale"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="too_large"})") == 1);
    BOOST_TEST(metric(m, "chargeguard_webhook_lag_seconds_count") == 1);
    BOOST_TEST(test::http_get(health, "/readyz").status == 200);

    // The secret never reaches the log.
    BOOST_TEST(slurp_file(rx.log_path).find(secret) == std::string::npos);
    BOOST_TEST(rx.terminate() == 0);
}
