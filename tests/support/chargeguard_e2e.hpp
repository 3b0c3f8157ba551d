// What the end-to-end tests of the built binary share (tests/integration/app consume_e2e,
// tests/integration/ops ops_e2e): chargeguard spawned as child processes with their output in files, waited
// for on timers (the test's loop keeps serving the fakes meanwhile), killed and cleaned up at the end; and a
// fixture with fake-stripe (TLS), fake-nsqd, a scratch PostgreSQL database and a pool to read the ledger.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "net/timeout.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/nsq/fake_nsqd.hpp"
#include "tests/integration/pg/support.hpp"
#include "tests/integration/stripe/fake_fixture.hpp"

extern char** environ;

namespace cg::test {

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The binary under test (meson sets CHARGEGUARD_EXE).
inline std::string chargeguard_exe() {
    const char* p = std::getenv("CHARGEGUARD_EXE");
    BOOST_TEST_REQUIRE(p != nullptr, "CHARGEGUARD_EXE not set (meson sets it)");
    return p;
}

// One child process: its pid (-1 once reaped) and the files its output went to.
struct child_process {
    pid_t pid = -1;
    std::string out_path;  // empty: stdout went to /dev/null
    std::string err_path;
    std::string out() const { return slurp(out_path); }
    std::string err() const { return slurp(err_path); }

    // The port the child's health server bound (it listens on port 0), from its startup log line.
    std::optional<unsigned short> logged_port() const {
        std::istringstream in(err());
        std::string line;
        simdjson::dom::parser p;
        while (std::getline(in, line)) {
            simdjson::dom::element doc;
            if (p.parse(line).get(doc) != simdjson::SUCCESS) continue;
            std::string_view msg;
            std::int64_t port = 0;
            if (doc["msg"].get(msg) == simdjson::SUCCESS && msg == "health server listening" &&
                doc["port"].get(port) == simdjson::SUCCESS)
                return static_cast<unsigned short>(port);
        }
        return std::nullopt;
    }
};

// The chargeguard processes one test started. `Child`: child_process or a type derived from it. References
// to children stay valid as more are added. Destroying (or kill_all) SIGKILLs those still running and
// removes their files (kept with CG_KEEP_LOGS set).
template <typename Child = child_process>
class child_processes {
  public:
    // Output files are named `prefix`-N.out / .err.
    explicit child_processes(std::string prefix) : prefix_(std::move(prefix)) {}
    ~child_processes() { kill_all(); }
    child_processes(const child_processes&) = delete;
    child_processes& operator=(const child_processes&) = delete;

    // Starts the binary with `args` (after the executable); stderr to a file, stdout to a file or to
    // /dev/null. The environment is inherited.
    Child& spawn(std::vector<std::string> args, bool capture_stdout = true) {
        Child c;
        auto n = std::to_string(children_.size());
        if (capture_stdout) c.out_path = prefix_ + "-" + n + ".out";
        c.err_path = prefix_ + "-" + n + ".err";
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        if (capture_stdout)
            posix_spawn_file_actions_addopen(&fa, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        else
            posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        args.insert(args.begin(), chargeguard_exe());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        BOOST_TEST_REQUIRE(rc == 0);
        children_.push_back(std::move(c));
        return children_.back();
    }

    // The child's exit code (128 + signal when a signal ended it), or -1 when it did not exit within
    // `limit` (then it is killed). Polls every 5 ms on a timer of the caller's executor.
    static net::awaitable<int> wait_exit(Child& c, std::chrono::milliseconds limit) {
        int status = 0;
        auto end = std::chrono::steady_clock::now() + limit;
        bool exited = false;
        while (!(exited = ::waitpid(c.pid, &status, WNOHANG) == c.pid)) {
            if (std::chrono::steady_clock::now() > end) break;
            co_await net::sleep_for(std::chrono::milliseconds(5));
        }
        if (!exited) {
            ::kill(c.pid, SIGKILL);
            ::waitpid(c.pid, &status, 0);
            c.pid = -1;
            co_return -1;
        }
        c.pid = -1;
        co_return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

    void kill_all() {
        for (auto& c : children_) {
            if (c.pid > 0 && ::waitpid(c.pid, nullptr, WNOHANG) == 0) {
                ::kill(c.pid, SIGKILL);
                ::waitpid(c.pid, nullptr, 0);
            }
            if (!std::getenv("CG_KEEP_LOGS")) {
                if (!c.out_path.empty()) ::unlink(c.out_path.c_str());
                ::unlink(c.err_path.c_str());
            }
        }
        children_.clear();
    }

    std::size_t size() const noexcept { return children_.size(); }

  private:
    std::string prefix_;
    std::deque<Child> children_;
};

// fake-stripe (from fake_stripe_fixture, on `io`), fake-nsqd once started, a scratch database, a pool on it,
// and the children. The Stripe key goes to the children through the environment, never argv.
template <typename Child = child_process>
struct chargeguard_e2e : fake_stripe_fixture {
    std::string topic, channel;
    scratch_db db;
    std::unique_ptr<nsq::fake_nsqd> nsqd;
    std::shared_ptr<pg::pool> pg;
    std::string tmp;  // a per-process prefix for files under /tmp
    child_processes<Child> children;

    // `name`: the scratch database's and the temporary files' name.
    chargeguard_e2e(const std::string& name, std::string topic_, std::string channel_,
                    const std::string& stripe_key)
        : topic(std::move(topic_)),
          channel(std::move(channel_)),
          db(name),
          tmp("/tmp/cg-" + name + "-e2e-" + std::to_string(::getpid())),
          children(tmp) {
        ::setenv("STRIPE_API_KEY", stripe_key.c_str(), 1);  // inherited by the children; never on argv
        pg::pool_options o;
        o.server = db.config();
        o.size = 2;
        pg = pg::pool::create(io.get_executor(), pool.get_executor(), std::move(o), logger());
    }
    ~chargeguard_e2e() {
        children.kill_all();
        try {
            run_async(io, [&]() -> net::awaitable<void> { co_await pg->close(); });
        } catch (...) {
        }
    }

    void start_nsqd(nsq::fake_nsqd_options o = {}) {
        nsqd = std::make_unique<nsq::fake_nsqd>(io.get_executor(), o);
        BOOST_TEST_REQUIRE(nsqd->start().has_value());
        nsqd->create_channel(topic, channel);
    }

    net::awaitable<int> wait_exit(Child& c, std::chrono::milliseconds limit) {
        return child_processes<Child>::wait_exit(c, limit);
    }

    std::string dsn() const { return "dbname=" + db.name; }

    // One statement on the scratch database (any failure fails the test).
    net::awaitable<pg::rows> query(std::string sql) {
        auto conn = co_await pg->acquire();
        BOOST_TEST_REQUIRE(conn.has_value(), (conn ? "" : conn.err().describe()));
        auto r = co_await (*conn)->query_with(sql, pg::params(), std::chrono::seconds(5));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()) + " in " + sql);
        co_return std::move(*r);
    }

    // billing_key (metadata) → charge ids fake-stripe holds for it.
    std::map<std::string, std::vector<std::string>> charges_by_key() const {
        std::map<std::string, std::vector<std::string>> out;
        for (const auto& ch : fake->charges())
            for (const auto& [k, v] : ch.metadata)
                if (k == "billing_key") out[v].push_back(ch.id);
        return out;
    }

    // Every key charged exactly once at fake-stripe and recorded `charged` with that charge id.
    net::awaitable<void> expect_charged_once(std::set<std::string> keys) {
        auto by_key = charges_by_key();
        BOOST_TEST(fake->charges().size() == keys.size());
        BOOST_TEST(by_key.size() == keys.size());
        auto rows =
            co_await query("SELECT key, status, coalesce(charge_id, '') FROM billing_records ORDER BY key");
        BOOST_TEST(rows.size() == keys.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
            std::string key(rows.text(i, 0));
            BOOST_TEST(keys.count(key) == 1u, key);
            BOOST_TEST(rows.text(i, 1) == "charged", key);
            auto it = by_key.find(key);
            BOOST_TEST_REQUIRE((it != by_key.end()), key);
            BOOST_TEST(it->second.size() == 1u, key);
            BOOST_TEST(rows.text(i, 2) == it->second.front(), key);
        }
    }
};

}  // namespace cg::test
