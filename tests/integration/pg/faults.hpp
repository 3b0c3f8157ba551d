// What the PostgreSQL fault tests share (faults_test.cpp, faults_cancel_commit_test.cpp): a process stopped
// with SIGSTOP and resumed, control of the shared server, and polling a condition on timers.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <boost/test/unit_test.hpp>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "helpers.hpp"
#include "net/boxed.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "pg/cancel.hpp"
#include "pg/migrations.hpp"
#include "pg/pipeline.hpp"
#include "support.hpp"
#include "support/pg_server_ctl.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;
using sclock = std::chrono::steady_clock;

namespace {

double seconds_since(sclock::time_point t) {
    return std::chrono::duration<double>(sclock::now() - t).count();
}

// SIGSTOPs a server process and SIGCONTs it when destroyed (also when a check throws), or after `limit` at
// the latest, from a watchdog thread: a test that hangs (the code under test blocking the loop) must never
// leave the shared server stopped.
struct stopped_process {
    std::mutex mu;
    std::condition_variable cv;
    pid_t pid;
    std::thread watchdog;

    stopped_process(pid_t p, std::chrono::seconds limit) : pid(p) {
        BOOST_TEST_REQUIRE(pid > 0);
        BOOST_TEST_REQUIRE(::kill(pid, SIGSTOP) == 0);
        watchdog = std::thread([this, limit] {
            std::unique_lock lock(mu);
            if (!cv.wait_for(lock, limit, [this] { return pid == 0; })) resume_locked();
        });
    }
    void resume_locked() {
        if (pid > 0) ::kill(pid, SIGCONT);
        pid = 0;
    }
    void resume() {
        {
            std::lock_guard lock(mu);
            resume_locked();
        }
        cv.notify_all();
    }
    ~stopped_process() {
        resume();
        watchdog.join();
    }
};

struct server_ctl : test::pg_server_ctl {
    server_ctl() : pg_server_ctl("stop and start the server") {}
    pid_t postmaster() const {
        std::ifstream f(dir + "/data/postmaster.pid");
        long pid = 0;
        f >> pid;
        return static_cast<pid_t>(pid);
    }
};

using test::run_ctl;

// Polls `cond` on timers (never blocking the loop) until it holds or `limit` passes.
template <typename Cond>
net::awaitable<bool> eventually(Cond cond, sclock::duration limit) {
    auto until = sclock::now() + limit;
    while (!(co_await cond())) {
        if (sclock::now() > until) co_return false;
        co_await net::sleep_for(20ms);
    }
    co_return true;
}

}  // namespace
