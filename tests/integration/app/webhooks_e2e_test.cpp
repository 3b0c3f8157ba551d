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
#include <vector>

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

    explicit receiver_process(const std::string& dbname, const std::vector<std::string>& extra = {}) {
        ::setenv("CHARGEGUARD_WEBHOOK_SECRET", secret.c_str(), 1);  // inherited; never on argv
        const char* exe = std::getenv("CHARGEGUARD_EXE");
        BOOST_TEST_REQUIRE(exe != nullptr, "CHARGEGUARD_EXE not set (meson sets it)");
        std::vector<std::string> args = {
            exe,           "webhooks",         "--listen", "127.0.0.1:0", "--health-listen",
            "127.0.0.1:0", "--max-body-bytes", "2048",     "--pg-dsn",    "dbname=" + dbname,
            "--migrate"};
        args.insert(args.end(), extra.begin(), extra.end());
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

// The first cell of `sql`'s result in database `db` (libpq's synchronous API, from the test thread).
std::string scalar(const std::string& db, const std::string& sql) {
    PGconn* c = PQconnectdb(("dbname=" + db).c_str());
    std::string out, err;
    if (PQstatus(c) != CONNECTION_OK) {
        err = PQerrorMessage(c);
    } else {
        PGresult* r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            err = PQresultErrorMessage(r);
        else if (PQntuples(r) > 0)
            out = PQgetvalue(r, 0, 0);
        PQclear(r);
    }
    PQfinish(c);
    BOOST_TEST_REQUIRE(err.empty(), sql << ": " << err);
    return out;
}

// A /proc/PID/status field in KiB (VmRSS, VmHWM).
long proc_kib(pid_t pid, const std::string& field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
    return -1;
}

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
        R"({"id":"evt_e2e_1","object":"event","api_version":"2024-06-20","type":"payment_intent.payment_failed",)"
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

namespace {

std::string intent_event(const std::string& evt, const std::string& type, const std::string& pi,
                         const std::string& status, const std::string& key, const std::string& account = {},
                         const std::string& version = "2024-06-20") {
    return R"({"id":")" + evt + R"(","object":"event","api_version":")" + version + R"(","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,)" +
           (account.empty() ? std::string() : R"("account":")" + account + R"(",)") +
           R"("data":{"object":{"id":")" + pi + R"(","object":"payment_intent","status":")" + status +
           R"(","latest_charge":"ch_)" + pi + R"(","metadata":{"billing_key":")" + key + R"("}}}})";
}

std::string charge_event(const std::string& evt, const std::string& type, const std::string& charge,
                         const std::string& status, const std::string& key, const std::string& extra = {}) {
    return R"({"id":")" + evt + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,"data":{"object":{"id":")" +
           charge + R"(","object":"charge","status":")" + status + R"(","payment_intent":null,)" + extra +
           R"("metadata":{"billing_key":")" + key + R"("}}}})";
}

}  // namespace

// The attack suite: forged, stale, foreign, cross-account, poison, oversize, slow and flooding clients
// against the built receiver and a real PostgreSQL. Each attack asserts its answer; the ledger is unchanged
// by all of them, the process stays up within its memory bound, and a genuine delivery is served after.
BOOST_AUTO_TEST_CASE(attacks_change_nothing_and_the_receiver_stays_up_and_bounded) {
    test::scratch_db db("webhooks_attack");
    // A budget of 1 MiB buffered across connections, 2 s to send a request.
    receiver_process rx(db.name, {"--read-timeout", "2s", "--max-buffered-bytes", "1048576",
                                  "--max-in-flight", "8", "--max-connections", "512"});
    const auto port = rx.port_of("webhook receiver listening");
    const auto health = rx.port_of("health server listening");
    const std::string own = "a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7", connect = "b8b8b8b8b8b8b8b8b8b8b8b8b8b8b8b8";
    test::admin_exec(
        "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
        "stripe_customer_id, status, payment_intent_id, processing_since, raw_body, nsq_topic, nsq_channel, "
        "nsq_message_id, stripe_account) VALUES "
        "('" +
            own +
            "', 'c-atk-1', '2026-12', 1999, 'usd', 'cus_1', 'processing', 'pi_atk_own', now(), "
            "convert_to('{}', 'UTF8'), 'billing', 'chargeguard', 'm-atk-1', NULL), "
            "('" +
            connect +
            "', 'c-atk-2', '2026-12', 1999, 'usd', 'cus_2', 'processing', 'pi_atk_connect', now(), "
            "convert_to('{}', 'UTF8'), 'billing', 'chargeguard', 'm-atk-2', 'acct_Atkrow')",
        db.name);
    auto ledger = [&] {
        return scalar(db.name,
                      "SELECT string_agg(key || ':' || status || ':' || coalesce(charge_id, '-'), ',' "
                      "ORDER BY key) || '|' || (SELECT count(*) FROM dead_letters) FROM billing_records");
    };
    const auto before = ledger();
    auto alive = [&] { return ::waitpid(rx.pid, nullptr, WNOHANG) == 0; };
    auto status_of = [&](const std::string& body, const std::string& signature) {
        return test::raw_http(port).exchange(post(body, signature)).status;
    };
    auto genuine = [&](const std::string& body) { return status_of(body, sign(body, secret, now_unix())); };

    const auto own_success =
        intent_event("evt_atk_ok", "payment_intent.succeeded", "pi_atk_own", "succeeded", own);
    // Forged, unsigned, stale.
    BOOST_TEST(status_of(own_success, sign(own_success, "whsec_forged_by_someone", now_unix())) == 400);
    BOOST_TEST(status_of(own_success, "t=" + std::to_string(now_unix())) == 400);
    BOOST_TEST(status_of(own_success, sign(own_success, secret, now_unix() - 3600)) == 400);
    // Foreign: charges carrying the row's key that are not its PaymentIntent's.
    BOOST_TEST(genuine(charge_event("evt_atk_f1", "charge.failed", "ch_atk_foreign", "failed", own)) == 200);
    BOOST_TEST(genuine(charge_event("evt_atk_f2", "charge.succeeded", "ch_atk_foreign2", "succeeded", own)) ==
               200);
    // Cross-account: the connected row's own PaymentIntent id, from another account and from the platform.
    BOOST_TEST(genuine(intent_event("evt_atk_x1", "payment_intent.payment_failed", "pi_atk_connect",
                                    "requires_payment_method", connect, "acct_Someoneelse")) == 200);
    BOOST_TEST(genuine(intent_event("evt_atk_x2", "payment_intent.succeeded", "pi_atk_connect", "succeeded",
                                    connect)) == 200);
    // Poison: refused once, then acknowledged; another API version: refused.
    const auto nul = charge_event("evt_atk_nul", "charge.failed", "ch_atk_nul", "failed", own,
                                  R"("description":"a\u0000b",)");
    BOOST_TEST(genuine(nul) == 400);
    BOOST_TEST(genuine(nul) == 200);
    BOOST_TEST(genuine(charge_event("evt_atk_dup", "charge.failed", "ch_atk_dup", "failed", own,
                                    R"("status":"succeeded",)")) == 400);
    BOOST_TEST(genuine(intent_event("evt_atk_v", "payment_intent.payment_failed", "pi_atk_own",
                                    "requires_payment_method", own, "", "2020-08-27")) == 400);
    // Oversize: over --max-body-bytes (the receiver's 413), and a declared 2 MiB (the listener's).
    const std::string big(3000, ' ');
    BOOST_TEST(status_of(big, sign(big, secret, now_unix())) == 413);
    BOOST_TEST(test::raw_http(port)
                   .exchange("POST /stripe/webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n")
                   .status == 413);
    // Slow: half a request head, then nothing: closed at --read-timeout.
    test::raw_http slow(port);
    slow.exchange_partial("POST /stripe/webhooks HTTP/1.1\r\nHost: x\r\nContent-Le");
    BOOST_TEST(slow.closed_by_peer());
    // Flooding: 200 clients each push 64 KiB of a declared 1 MiB at once: past the 1 MiB budget they are
    // answered 503 and closed; the rest wait for bodies that never come and are closed at the timeout.
    int busy = 0;
    {
        const std::string head =
            "POST /stripe/webhooks HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=1,v1=" + std::string(64, '0') +
            "\r\nContent-Length: 1048576\r\n\r\n";
        const std::string part(64 * 1024, 'x');
        std::vector<std::unique_ptr<test::raw_http>> flood;
        for (int i = 0; i < 200; ++i) {
            flood.push_back(std::make_unique<test::raw_http>(port));
            try {
                flood.back()->exchange_partial(head + part);
            } catch (const std::exception&) {
            }
        }
        int closed = 0, other = 0;
        for (auto& c : flood) {
            try {
                auto r = c->read_response();
                if (r.status == 503 && r.headers.get("Retry-After"))
                    ++busy;
                else
                    ++other;
            } catch (const std::exception&) {
                ++closed;
            }
        }
        BOOST_TEST(busy >= 150, busy << " answered 503, " << closed << " closed, " << other << " other");
        BOOST_TEST(other == 0);
    }
    BOOST_TEST(alive());
    const long peak_kib = proc_kib(rx.pid, "VmHWM");
#if defined(__SANITIZE_ADDRESS__)
    // ASan's shadow memory and its quarantine of freed blocks (up to 256 MiB) come on top of the receiver's
    // own.
    constexpr long bound_kib = 512 * 1024;
#else
    constexpr long bound_kib = 48 * 1024;
#endif
    BOOST_TEST(peak_kib < bound_kib, "peak RSS " << peak_kib << " KiB");
    BOOST_TEST(ledger() == before);

    // Still serving: the row's own success applies.
    BOOST_TEST(genuine(own_success) == 200);
    BOOST_TEST(scalar(db.name, "SELECT status FROM billing_records WHERE key = '" + own + "'") == "charged");
    BOOST_TEST(
        scalar(db.name, "SELECT count(*) FROM stripe_webhook_events WHERE outcome = 'other_payment'") == "4");
    auto m = test::http_get(health, "/metrics").body;
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="other_payment"})") == 4);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="poison"})") == 2);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="wrong_api_version"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="bad_signature"})") == 2);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="stale"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="too_large"})") == 1);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="error"})") == 0);
    BOOST_TEST(metric(m, R"(chargeguard_webhook_deliveries_total{outcome="recorded"})") == 1);
    // Every 503 of the budget is counted by the listener (a shed client may miss its answer: at least).
    BOOST_TEST(metric(m, R"(chargeguard_http_shed_total{listener="webhooks",reason="buffered_bytes"})") >=
               busy);
    BOOST_TEST(metric(m, R"(chargeguard_http_shed_total{listener="webhooks",reason="refused"})") == 0);
    BOOST_TEST(slurp_file(rx.log_path).find(secret) == std::string::npos);
    BOOST_TEST(rx.terminate() == 0);
}
