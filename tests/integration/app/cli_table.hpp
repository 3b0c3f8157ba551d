// What the cli_table tests share (cli_table_test.cpp, cli_table_environment_test.cpp): the built
// `chargeguard` run with an argv and an environment (the shipped ConfigMap's, or none) and the table of rows
// each case checks (exit code, a phrase on its output). Every case fails before anything connects, so none
// needs a server.
#pragma once

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

inline env_map with(env_map base, const env_map& more) {
    for (const auto& [k, v] : more) base[k] = v;
    return base;
}

inline std::string exe() {
    const char* p = std::getenv("CHARGEGUARD_EXE");
    BOOST_REQUIRE_MESSAGE(p, "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

inline std::string scratch() {
    static std::string dir = [] {
        std::string t = "/tmp/cg-cli-table-XXXXXX";
        BOOST_REQUIRE(::mkdtemp(t.data()) != nullptr);
        return t;
    }();
    return dir;
}

inline std::string write_file(const std::string& name, const std::string& content) {
    auto path = scratch() + "/" + name;
    std::ofstream(path) << content;
    return path;
}

inline std::string slurp(const std::string& path) {
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
inline outcome run(const std::vector<std::string>& args, const env_map& env) {
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

inline void check(const std::vector<row>& rows) {
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
inline env_map configmap_with_key() {
    static std::string path = [] {
        auto p = scratch() + "/stripe_api_key";
        std::ofstream(p) << "sk_test_cli_table_0123456789\n";
        ::chmod(p.c_str(), 0600);
        return p;
    }();
    return with(configmap, {{"CHARGEGUARD_STRIPE_KEY_FILE", path}});
}

// consume's argv up to the point each row adds the flag under test; every other flag valid.
inline std::vector<std::string> consume(std::vector<std::string> more) {
    std::vector<std::string> a = {"consume", "--topic", "t", "--channel", "c", "--nsqd-tcp-address", nowhere};
    a.insert(a.end(), more.begin(), more.end());
    return a;
}

}  // namespace
