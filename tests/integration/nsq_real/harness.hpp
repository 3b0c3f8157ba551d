// The real NSQ 1.3.0 daemons for tests: nsqd / nsqlookupd started from NSQD_BIN / NSQLOOKUPD_BIN on
// loopback with a fresh --data-path, an async HTTP client for their APIs (/stats, /mpub, pause …), and
// the same API spoken to fake-nsqd, so a scenario can run against both ("broker"). The HTTP face is
// nsqd_http.hpp.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsqd_http.hpp"

extern char** environ;

namespace nsqreal {

using namespace std::chrono;
namespace fs = std::filesystem;

inline std::string env_or_empty(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

// Polls `cond` every 5 ms on a timer until true; false after `limit`.
inline asio::awaitable<bool> eventually(std::function<bool()> cond, milliseconds limit = seconds(10)) {
    auto end = steady_clock::now() + limit;
    while (!cond()) {
        if (steady_clock::now() > end) co_return false;
        co_await cg::net::sleep_for(milliseconds(5));
    }
    co_return true;
}

// Everything the peer sends on `s` until it closes the connection (every exchange this reads ends in a
// fatal error, so nsqd closes); throws when nothing closes it within 5 s of silence.
inline asio::awaitable<std::string> read_until_close(cg::net::tcp_socket& s) {
    std::string got;
    char buf[4096];
    for (;;) {
        auto r = co_await cg::net::with_timeout(s.async_read_some(asio::buffer(buf)), seconds(5));
        if (!r) throw std::runtime_error("no close");
        auto [ec, n] = *r;
        if (ec) co_return got;
        got.append(buf, n);
    }
}

// A port nothing listens on right now (bind to 0, read, close).
inline std::uint16_t free_port() {
    asio::io_context io;
    asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
}

inline std::string make_temp_dir(const std::string& tag) {
    std::string t = "/tmp/cg-nsqreal-" + tag + "-XXXXXX";
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    return t;
}

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// posix_spawn with stdout/stderr to files (stdin from `in` when given). Returns the pid.
inline pid_t spawn(std::vector<std::string> args, const std::string& out, const std::string& err,
                   const std::string& in = {}, const std::vector<std::string>& extra_env = {}) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!in.empty()) posix_spawn_file_actions_addopen(&fa, 0, in.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) envs.emplace_back(*e);
    for (const auto& e : extra_env) envs.push_back(e);
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
    return pid;
}

// Waits for a child without blocking the loop; its exit code, 128+signal, or -1 after `limit` (then it
// is killed).
inline asio::awaitable<int> wait_exit(pid_t pid, milliseconds limit) {
    int status = 0;
    bool exited = co_await eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, limit);
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        co_return -1;
    }
    co_return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One real daemon process. Stopped (SIGKILL if it must) on destruction.
class daemon_process {
  public:
    daemon_process() = default;
    daemon_process(const daemon_process&) = delete;
    daemon_process& operator=(const daemon_process&) = delete;
    ~daemon_process() { kill_now(); }

    // Starts `args` and waits until GET /ping on `http_port` answers 200.
    asio::awaitable<void> start(std::vector<std::string> args, std::uint16_t http_port,
                                std::string log_path) {
        log_ = std::move(log_path);
        pid_ = spawn(std::move(args), log_ + ".out", log_);
        bool up = false;
        auto end = steady_clock::now() + seconds(15);
        while (!up && steady_clock::now() < end) {
            int st = 0;
            if (::waitpid(pid_, &st, WNOHANG) == pid_) {
                pid_ = -1;
                throw std::runtime_error("daemon exited at start: " + slurp(log_));
            }
            try {
                auto r = co_await http_call(http_port, "GET", "/ping", {}, milliseconds(500));
                up = r.status == 200;
            } catch (const std::exception&) {
            }
            if (!up) co_await cg::net::sleep_for(milliseconds(20));
        }
        if (!up) throw std::runtime_error("daemon did not answer /ping: " + slurp(log_));
    }
    // SIGTERM and wait for a clean exit. Returns the exit code.
    asio::awaitable<int> stop() {
        if (pid_ <= 0) co_return 0;
        ::kill(pid_, SIGTERM);
        int code = co_await wait_exit(pid_, seconds(15));
        pid_ = -1;
        co_return code;
    }
    void kill_now() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        int st = 0;
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
    }
    const std::string& log_path() const { return log_; }

  private:
    pid_t pid_ = -1;
    std::string log_;
};

struct nsqd_options {
    std::vector<std::string> extra;             // more nsqd flags
    std::uint16_t lookupd_tcp_port = 0;         // register with this nsqlookupd
    std::string data_path;                      // empty: a fresh temp dir
    std::uint16_t tcp_port = 0, http_port = 0;  // 0: free ports
};

class real_nsqd {
  public:
    explicit real_nsqd(nsqd_options o = {}) : opts_(std::move(o)) {}

    asio::awaitable<void> start() {
        if (opts_.data_path.empty()) opts_.data_path = make_temp_dir("nsqd");
        if (!opts_.tcp_port) opts_.tcp_port = free_port();
        if (!opts_.http_port) opts_.http_port = free_port();
        std::vector<std::string> args = {env_or_empty("NSQD_BIN"),
                                         "--tcp-address=127.0.0.1:" + std::to_string(opts_.tcp_port),
                                         "--http-address=127.0.0.1:" + std::to_string(opts_.http_port),
                                         "--data-path=" + opts_.data_path,
                                         "--broadcast-address=127.0.0.1",
                                         "--log-level=warn"};
        if (opts_.lookupd_tcp_port)
            args.push_back("--lookupd-tcp-address=127.0.0.1:" + std::to_string(opts_.lookupd_tcp_port));
        for (const auto& e : opts_.extra) args.push_back(e);
        co_await proc_.start(args, opts_.http_port, opts_.data_path + "/nsqd.log");
    }
    asio::awaitable<int> stop() { co_return co_await proc_.stop(); }
    // SIGTERM, then the same ports and data path again (nsqd persists its queues and in-flight messages).
    asio::awaitable<void> restart() {
        co_await proc_.stop();
        co_await start();
    }
    ~real_nsqd() {
        proc_.kill_now();
        std::error_code ec;
        if (!opts_.data_path.empty()) fs::remove_all(opts_.data_path, ec);
    }

    std::string tcp_address() const { return "127.0.0.1:" + std::to_string(opts_.tcp_port); }
    std::uint16_t tcp_port() const { return opts_.tcp_port; }
    std::uint16_t http_port() const { return opts_.http_port; }
    nsqd_http http() const { return {opts_.http_port}; }
    std::string log() const { return slurp(proc_.log_path()); }

  private:
    nsqd_options opts_;
    daemon_process proc_;
};

class real_nsqlookupd {
  public:
    asio::awaitable<void> start() {
        dir_ = make_temp_dir("lookupd");
        tcp_ = free_port();
        http_ = free_port();
        std::vector<std::string> args = {env_or_empty("NSQLOOKUPD_BIN"),
                                         "--tcp-address=127.0.0.1:" + std::to_string(tcp_),
                                         "--http-address=127.0.0.1:" + std::to_string(http_),
                                         "--broadcast-address=127.0.0.1", "--log-level=warn"};
        co_await proc_.start(args, http_, dir_ + "/nsqlookupd.log");
    }
    ~real_nsqlookupd() {
        proc_.kill_now();
        std::error_code ec;
        if (!dir_.empty()) fs::remove_all(dir_, ec);
    }
    std::uint16_t tcp_port() const { return tcp_; }
    std::string http_address() const { return "127.0.0.1:" + std::to_string(http_); }
    std::uint16_t http_port() const { return http_; }

  private:
    std::string dir_;
    std::uint16_t tcp_ = 0, http_ = 0;
    daemon_process proc_;
};

// nsqd scans a channel for timed-out messages only after its queue-scan refresh (5 s) has seen the
// channel: a test that needs timeouts creates its channel and waits this long first.
inline constexpr auto queue_scan_refresh = milliseconds(5200);

}  // namespace nsqreal
