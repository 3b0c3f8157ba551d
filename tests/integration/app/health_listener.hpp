// What the health listener's tests share (health_listener_test.cpp, health_listener_tls_test.cpp): the
// built binary spawned with nothing to connect to (PostgreSQL, nsqd and Stripe are refused ports), its
// listener's address from its log, and GETs on it with or without basic credentials.
#pragma once

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

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

inline std::string exe() {
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
inline answer get(const std::string& origin, const std::string& path, const std::string& authorization = "") {
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

inline std::string basic(const std::string& user, const std::string& password) {
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

inline std::string origin(const char* scheme, unsigned short port) {
    return std::string(scheme) + "://127.0.0.1:" + std::to_string(port);
}

}  // namespace
