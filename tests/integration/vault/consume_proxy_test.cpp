// `consume` through the proxy, unchanged: the real chargeguard binary (a child process) with
// --stripe-api-base = the vault proxy and the vault secret as its Stripe key, reading from fake-nsqd; the
// proxy, fake-nsqd and fake-stripe (TLS) run on this test's io_context. A cap refusal becomes `cap_blocked`
// in the ledger. Awaited on counters and the database, never on sleeps. Skipped (77) without PGHOST.
#define BOOST_TEST_MODULE vault_consume_proxy
#define BOOST_TEST_NO_MAIN
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/pg_main.hpp"
#include "tests/doubles/nsq/fake_nsqd.hpp"
#include "tests/integration/vault/fixture.hpp"

extern char** environ;

using namespace cg;
using namespace cg::test;
using namespace std::chrono;

namespace {

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

net::awaitable<bool> eventually(std::function<bool()> cond, milliseconds limit) {
    auto end = steady_clock::now() + limit;
    while (!cond()) {
        if (steady_clock::now() > end) co_return false;
        co_await net::sleep_for(milliseconds(10));
    }
    co_return true;
}

// A log file of this run's own, made by mkstemp under $TMPDIR (/tmp by default): never a path another run,
// or another user, could hold or have planted.
std::string private_log(const char* stem) {
    const char* dir = std::getenv("TMPDIR");
    std::string path = std::string(dir && *dir ? dir : "/tmp") + "/cg-vault-" + stem + "-XXXXXX";
    int fd = ::mkstemp(path.data());
    BOOST_TEST_REQUIRE(fd >= 0, "mkstemp " << path);
    ::close(fd);
    return path;
}

std::string event_json(int customer, std::int64_t amount) {
    return R"({"customer_id":"c-)" + std::to_string(customer) +
           R"(","billing_period":"2026-11","amount_cents":)" + std::to_string(amount) +
           R"(,"currency":"usd","stripe_customer_id":"cus_)" + std::to_string(customer) +
           R"(","description":"November"})";
}

}  // namespace

BOOST_AUTO_TEST_CASE(consume_through_the_proxy_is_capped_and_blocked_rows_are_cap_blocked) {
    vault_fixture f;
    const char* exe = std::getenv("CHARGEGUARD_EXE");
    BOOST_TEST_REQUIRE(exe != nullptr);
    test::nsq::fake_nsqd nsqd(f.io.get_executor());
    BOOST_TEST_REQUIRE(nsqd.start().has_value());
    nsqd.create_channel("billing", "chargeguard");
    // 30 customers at 10.00, each also delivered twice (a duplicate right behind it); the key allows 25.
    auto k = f.issue(25 * 1000);
    for (int i = 0; i < 30; ++i) {
        nsqd.publish("billing", event_json(i, 1000));
        if (i % 3 == 0) nsqd.publish("billing", event_json(i, 1000));
    }
    const std::uint64_t published = 40;

    const std::string err_path = private_log("consume");
    std::vector<std::string> args{
        exe, "consume", "--topic", "billing", "--channel", "chargeguard", "--nsqd-tcp-address",
        nsqd.tcp_address(), "--heartbeat-interval", "1s", "--pg-dsn", "dbname=" + f.db.name, "--migrate",
        "--stripe-api-base", "http://127.0.0.1:" + std::to_string(f.proxy_port), "--allow-insecure-http",
        "--key-namespace", "vault-e2e",
        // A duplicate waits for its original's lease: keep the lease short.
        "--lease", "2s", "--lease-renew-interval", "500ms", "--lease-held-delay", "200ms",
        "--retry-same-key-delay", "200ms", "--indeterminate-delay", "300ms", "--health-listen", "127.0.0.1:0",
        "--shutdown-timeout", "10", "--max-loop-lag", "5"};
    ::setenv("STRIPE_API_KEY", k.secret.c_str(),
             1);  // the vault secret is consume's "Stripe key"; never argv
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    BOOST_TEST_REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::unsetenv("STRIPE_API_KEY");
    struct reaper {
        pid_t& pid;
        std::string path;
        ~reaper() {
            if (pid > 0) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
            ::unlink(path.c_str());
        }
    } reap{pid, err_path};

    bool drained = f.run(eventually(
        [&] { return nsqd.channel("billing", "chargeguard").finish_count == published; }, seconds(60)));
    BOOST_TEST_REQUIRE(drained, slurp(err_path));
    ::kill(pid, SIGTERM);
    int status = 0;
    bool exited = f.run(eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, seconds(20)));
    BOOST_TEST_REQUIRE(exited);
    pid = -1;
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0));

    // 25 charged at Stripe, 5 refused by the proxy before Stripe: cap_blocked in the ledger with a dead
    // letter each (replayable once the cap is raised), FINed.
    BOOST_TEST(f.fake_charges() == 25u);
    BOOST_TEST(f.count("SELECT count(*) FROM billing_records WHERE status = 'charged'") == 25);
    BOOST_TEST(f.count("SELECT count(*) FROM billing_records WHERE status = 'cap_blocked'") == 5);
    BOOST_TEST(f.count("SELECT count(*) FROM dead_letters") == 5);
    BOOST_TEST(f.count("SELECT count(*) FROM dead_letters d JOIN billing_records b ON b.key = d.billing_key "
                       "WHERE d.reason = 'spend cap exceeded' AND b.status = 'cap_blocked'") == 5);
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled'") ==
               25'000);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state IN ('reserved', 'uncertain')") == 0);
    // The ledger's charge ids are the ones the proxy settled.
    BOOST_TEST(f.count("SELECT count(*) FROM billing_records b JOIN vault_spend s ON s.stripe_object_id = "
                       "b.charge_id") == 25);
    auto log = slurp(err_path);
    BOOST_TEST(log.find(k.secret.substr(22)) == std::string::npos);  // consume never logs its key
    BOOST_TEST(!f.sink.contains(real_key));
}

namespace {

// Spawns the binary with `args` (argv[0] included), stderr to `err_path`; the pid.
pid_t spawn_to(const std::vector<std::string>& args, const std::string& err_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    BOOST_TEST_REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

}  // namespace

// A retried decline through the proxy: the declined call's reservation is released, the retry's new key
// generation reserves again and is charged once, within a cap that fits exactly one charge; a re-publication
// of the event afterwards charges nothing.
BOOST_AUTO_TEST_CASE(a_retried_decline_is_charged_once_within_the_cap) {
    vault_fixture f;
    const char* exe = std::getenv("CHARGEGUARD_EXE");
    BOOST_TEST_REQUIRE(exe != nullptr);
    test::nsq::fake_nsqd nsqd(f.io.get_executor());
    BOOST_TEST_REQUIRE(nsqd.start().has_value());
    nsqd.create_channel("billing", "chargeguard");
    auto k = f.issue(1000);
    f.fake->decline("cus_7");
    nsqd.publish("billing", event_json(7, 1000));
    const std::string err_path = private_log("retry");
    const std::string dsn = "dbname=" + f.db.name;
    ::setenv("STRIPE_API_KEY", k.secret.c_str(),
             1);  // the vault secret is consume's "Stripe key"; never argv
    pid_t pid = spawn_to({exe,
                          "consume",
                          "--topic",
                          "billing",
                          "--channel",
                          "chargeguard",
                          "--nsqd-tcp-address",
                          nsqd.tcp_address(),
                          "--heartbeat-interval",
                          "1s",
                          "--pg-dsn",
                          dsn,
                          "--migrate",
                          "--stripe-api-base",
                          "http://127.0.0.1:" + std::to_string(f.proxy_port),
                          "--allow-insecure-http",
                          "--key-namespace",
                          "vault-e2e",
                          "--lease",
                          "2s",
                          "--lease-renew-interval",
                          "500ms",
                          "--health-listen",
                          "127.0.0.1:0",
                          "--shutdown-timeout",
                          "10",
                          "--max-loop-lag",
                          "5"},
                         err_path);
    ::unsetenv("STRIPE_API_KEY");
    struct reaper {
        pid_t& pid;
        std::string path;
        ~reaper() {
            if (pid > 0) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
            ::unlink(path.c_str());
        }
    } reap{pid, err_path};
    auto finished = [&](std::uint64_t n) {
        return f.run(eventually([&] { return nsqd.channel("billing", "chargeguard").finish_count == n; },
                                seconds(60)));
    };
    BOOST_TEST_REQUIRE(finished(1), slurp(err_path));
    BOOST_TEST_REQUIRE(f.count("SELECT count(*) FROM billing_records WHERE status = 'declined'") == 1);
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state = 'released'") == 1);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state IN ('reserved', 'uncertain')") == 0);

    // The card is fixed; the retry reopens the row and publishes the event (nsqd runs on this loop).
    f.fake->clear_decline("cus_7");
    pid_t retry =
        spawn_to({exe, "retry-declined", "--customer", "c-7", "--period", "2026-11", "--reason",
                  "card updated", "--by", "alice", "--nsqd-tcp-address", nsqd.tcp_address(), "--pg-dsn", dsn},
                 err_path);
    int status = -1;
    BOOST_TEST_REQUIRE(
        f.run(eventually([&] { return ::waitpid(retry, &status, WNOHANG) == retry; }, seconds(30))));
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), slurp(err_path));
    BOOST_TEST_REQUIRE(finished(2), slurp(err_path));
    // A re-publication of the original event afterwards: a duplicate.
    nsqd.publish("billing", event_json(7, 1000));
    BOOST_TEST_REQUIRE(finished(3), slurp(err_path));

    BOOST_TEST(
        f.count("SELECT count(*) FROM billing_records WHERE status = 'charged' AND key_generation = 2") == 1,
        slurp(err_path));
    BOOST_TEST(f.run([](fake::fake_stripe* s) -> net::awaitable<std::size_t> {
        std::size_t ok = 0;
        for (const auto& ch : s->charges()) ok += ch.status == "succeeded" ? 1 : 0;
        co_return ok;
    }(f.fake.get())) == 1u);
    f.settle_now();
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled'") ==
               1000);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state IN ('reserved', 'uncertain')") == 0);
    BOOST_TEST(f.count("SELECT count(*) FROM billing_retries WHERE requested_by = 'alice'") == 1);
    ::kill(pid, SIGTERM);
    bool exited = f.run(eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, seconds(20)));
    BOOST_TEST_REQUIRE(exited);
    pid = -1;
}
