// What the process_e2e tests share (process_e2e_test.cpp, process_refusals_test.cpp): the built binary
// against fake-nsqd, fake-stripe (TLS) and scratch PostgreSQL databases, awaited on the child's log, its
// /startupz and /metrics, fake-nsqd and PostgreSQL — never on sleeps.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>

#include "billing/machine/key.hpp"
#include "http/client.hpp"
#include "pg/migrations.hpp"
#include "support/chargeguard_e2e.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/integration/nsq/helpers.hpp"

using namespace cg;
using namespace std::chrono;
using nsqtest::eventually;
namespace fs = std::filesystem;

namespace {

const std::string topic = "billing", channel = "chargeguard";
const std::string stripe_key = "sk_test_process_never_logged";

inline std::string event_json(int customer) {
    return R"({"customer_id":"cust-)" + std::to_string(customer) +
           R"(","billing_period":"2024-09","amount_cents":1200,"currency":"usd","stripe_customer_id":"cus_p",)"
           R"("description":"plan"})";
}

struct child : test::child_process {
    unsigned short health_port = 0;
};

// The repository's migrations/ (meson sets CG_MIGRATIONS_DIR).
inline std::string source_migrations() {
    const char* d = std::getenv("CG_MIGRATIONS_DIR");
    BOOST_TEST_REQUIRE(d != nullptr, "CG_MIGRATIONS_DIR not set (meson sets it)");
    return d;
}

struct proc : test::chargeguard_e2e<child> {
    proc() : chargeguard_e2e("process", ::topic, ::channel, ::stripe_key) {}

    std::vector<std::string> consume_args(const std::string& dbname) const {
        return {"consume",
                "--topic",
                topic,
                "--channel",
                channel,
                "--nsqd-tcp-address",
                nsqd->tcp_address(),
                "--heartbeat-interval",
                "1s",
                "--pg-dsn",
                "dbname=" + dbname,
                "--stripe-api-base",
                "https://127.0.0.1:" + std::to_string(port),
                "--stripe-ca-file",
                test::cert("ca.pem"),
                "--key-namespace",
                "process",
                "--health-listen",
                "127.0.0.1:0",
                "--shutdown-timeout",
                "10",
                "--max-loop-lag",
                "5"};
    }

    // A migrations directory holding the embedded migrations up to `upto` plus `extra` (name → SQL).
    std::string migrations_dir(const std::string& tag, int upto,
                               const std::vector<std::pair<std::string, std::string>>& extra = {}) {
        std::string dir = tmp + "-" + tag;
        fs::remove_all(dir);
        fs::create_directories(dir);
        dirs_.push_back(dir);
        for (const auto& e : fs::directory_iterator(source_migrations())) {
            auto name = e.path().filename().string();
            if (e.path().extension() == ".sql" && std::stoi(name.substr(0, 4)) <= upto)
                fs::copy_file(e.path(), dir + "/" + name);
        }
        for (const auto& [name, sql] : extra) std::ofstream(dir + "/" + name) << sql;
        return dir;
    }
    ~proc() {
        for (const auto& d : dirs_) fs::remove_all(d);
    }

    // Runs one `chargeguard migrate` to completion; returns its exit code.
    net::awaitable<int> migrate(const std::string& dbname, const std::string& dir = "") {
        std::vector<std::string> args{"migrate", "--pg-dsn", "dbname=" + dbname};
        if (!dir.empty()) args.insert(args.end(), {"--migrations-dir", dir});
        auto& c = children.spawn(args);
        int rc = co_await wait_exit(c, seconds(60));
        BOOST_TEST(rc == 0, c.err());
        co_return rc;
    }

    net::awaitable<void> await_port(child& c) {
        bool up = co_await eventually([&] { return c.logged_port().has_value(); }, seconds(20));
        BOOST_TEST_REQUIRE(up, c.err());
        c.health_port = *c.logged_port();
    }

    net::awaitable<http::client_result> get(const child& c, std::string path) {
        auto cl = http::client::create(io.get_executor(), "http://127.0.0.1:" + std::to_string(c.health_port),
                                       {}, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        http::request req;
        req.target = std::move(path);
        co_return co_await (*cl)->request(std::move(req));
    }

    net::awaitable<double> gauge(const child& c, const std::string& name) {
        auto r = co_await get(c, "/metrics");
        BOOST_TEST_REQUIRE(r.ok());
        auto fams = test::parse_prometheus(r.resp.body);
        auto it = fams.find(name);
        BOOST_TEST_REQUIRE((it != fams.end()), name);
        co_return it->second.samples.at(0).value;
    }

    // Waits until `path` answers `status`.
    net::awaitable<bool> await_status(const child& c, const std::string& path, int status, seconds limit) {
        auto end = steady_clock::now() + limit;
        while (steady_clock::now() < end) {
            auto r = co_await get(c, path);
            if (r.ok() && r.resp.status == status) co_return true;
            co_await net::sleep_for(milliseconds(20));
        }
        co_return false;
    }

    net::awaitable<void> terminate(child& c) {
        ::kill(c.pid, SIGTERM);
        BOOST_TEST(co_await wait_exit(c, seconds(20)) == 0, c.err());
    }

    // A child run to its exit for a configuration error: its exit code and stderr.
    net::awaitable<std::pair<int, std::string>> run_to_exit(std::vector<std::string> args) {
        auto& c = children.spawn(std::move(args));
        int rc = co_await wait_exit(c, seconds(20));
        co_return std::pair{rc, c.err() + c.out()};
    }

    std::vector<std::string> dirs_;
};

template <typename F>
void run(proc& f, F body, seconds limit = seconds(90)) {
    test::run_async(f.io, body, limit);
}

inline bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

}  // namespace
