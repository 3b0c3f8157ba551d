// The pool while the PostgreSQL server restarts under load, and event-loop lag under 10 000 queries.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <map>
#include <thread>

#include "helpers.hpp"
#include "net/lag_probe.hpp"
#include "net/timeout.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;
using cg::test::must;
using cg::test::pg_fixture;

namespace {

// Nanoseconds this thread has spent runnable but not running (waiting for a CPU), from
// /proc/thread-self/schedstat; -1 when the kernel does not provide it.
std::int64_t run_queue_delay_ns(int fd) {
    char buf[128];
    auto n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    long long on_cpu = 0, waiting = 0;
    if (std::sscanf(buf, "%lld %lld", &on_cpu, &waiting) != 2) return -1;
    return waiting;
}

// Records every lateness of a 1 ms timer on the loop under test. Two views:
//  * raw: how late the tick fired (what the foundation's lag histogram reports);
//  * own: raw minus the time the kernel kept this thread waiting for a CPU since the previous tick. On this
//    2-core machine the PostgreSQL backends and other processes preempt the loop until the next 4 ms
//    scheduler tick (CONFIG_HZ=250) regardless of what the loop does; "own" is the part the loop itself
//    caused (running code or blocking in a syscall), which is what "nothing blocks the loop" is about.
struct lag_recorder {
    std::vector<double> raw, own;
    int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    std::int64_t last_delay = -1;
    std::shared_ptr<net::lag_probe> probe;

    explicit lag_recorder(asio::io_context& io)
        : probe(std::make_shared<net::lag_probe>(io.get_executor(), 1ms, [this](double s) { record(s); })) {
        last_delay = fd >= 0 ? run_queue_delay_ns(fd) : -1;
        probe->start();
    }
    ~lag_recorder() {
        probe->stop();  // the probe outlives us; it must stop calling back
        if (fd >= 0) ::close(fd);
    }
    void record(double s) {
        raw.push_back(s);
        auto now = fd >= 0 ? run_queue_delay_ns(fd) : -1;
        double waited = now >= 0 && last_delay >= 0 ? static_cast<double>(now - last_delay) / 1e9 : 0.0;
        last_delay = now;
        own.push_back(std::max(0.0, s - waited));
    }
    bool have_schedstat() const { return fd >= 0 && last_delay >= 0; }
    static double percentile(std::vector<double> v, double p) {
        if (v.empty()) return 0;
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
    }
};

// Waits (on timers, never blocking the loop) until `cond` holds or `limit` passes.
template <typename Cond>
net::awaitable<bool> eventually(Cond cond, std::chrono::steady_clock::duration limit) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (!cond()) {
        if (std::chrono::steady_clock::now() > until) co_return false;
        co_await net::sleep_for(5ms);
    }
    co_return true;
}

struct restart_run {
    std::shared_ptr<pg::pool> pool;
    bool stop = false;
    bool restart_done = false;
    int restart_rc = -1;
    int workers_left = 0;
    std::int64_t next_id = 0;
    std::size_t ok_before = 0, ok_after = 0, wrong = 0, failed = 0, unavailable = 0;
    std::map<std::string, int> classes;
    std::vector<std::int64_t> committed;  // ids whose INSERT reported success
};

net::awaitable<void> restart_worker(restart_run& s) {
    while (!s.stop) {
        auto c = co_await s.pool->acquire();
        if (!c) {
            ++s.unavailable;
            ++s.classes[pg::error_class(c.code())];
            co_await net::sleep_for(10ms);  // a caller backing off (billing would REQ the message)
            continue;
        }
        auto id = s.next_id++;
        auto r =
            co_await (*c)->query("INSERT INTO t (id, v) VALUES ($1, $2) RETURNING id, v * 3 + 1", id, id);
        if (!r) {
            ++s.failed;
            ++s.classes[pg::error_class(r.code())];
            continue;
        }
        if (r->size() != 1 || (*r)[0].get<std::int64_t>(0) != id ||
            (*r)[0].get<std::int64_t>(1) != id * 3 + 1) {
            ++s.wrong;
            continue;
        }
        s.committed.push_back(id);
        ++(s.restart_done ? s.ok_after : s.ok_before);
    }
    --s.workers_left;
}

net::awaitable<void> restart_under_load(pg_fixture& f, std::string db, std::string restart_cmd) {
    lag_recorder lag(f.io);
    metrics::health health;
    pg::pool_options o;
    o.server = cg::test::server_config("dbname=" + db);
    o.size = 4;
    o.acquire_timeout = 500ms;
    o.backoff_initial = 50ms;
    o.backoff_max = 400ms;
    o.conn.query_timeout = 3s;
    restart_run s;
    s.pool = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
    s.pool->add_readiness_check(health);
    s.pool->start();
    {
        auto c = must(co_await s.pool->acquire(), "setup");
        must(co_await c->execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint NOT NULL)"), "create");
    }
    s.workers_left = 8;
    for (int i = 0; i < 8; ++i)
        asio::co_spawn(f.io, restart_worker(s), [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    BOOST_TEST_REQUIRE(co_await eventually([&] { return s.ok_before >= 300; }, 20s));

    // Restart the server on a thread: the loop keeps running the workers (and failing fast) meanwhile.
    std::thread restarter([&s, &f, restart_cmd] {
        int rc = std::system(restart_cmd.c_str());
        asio::post(f.io, [&s, rc] {
            s.restart_rc = rc;
            s.restart_done = true;
        });
    });
    bool saw_not_ready = false;
    while (!s.restart_done) {
        if (!health.ready().ok) saw_not_ready = true;
        co_await net::sleep_for(2ms);
    }
    restarter.join();
    bool recovered = co_await eventually([&] { return s.ok_after >= 300; }, 30s);
    s.stop = true;
    co_await eventually([&] { return s.workers_left == 0; }, 10s);

    std::string classes;
    for (auto& [k, v] : s.classes) classes += k + "=" + std::to_string(v) + " ";
    BOOST_TEST_MESSAGE("restart: ok before " << s.ok_before << ", after " << s.ok_after << ", failed "
                                             << s.failed << ", unavailable " << s.unavailable << " ["
                                             << classes << "], max lag "
                                             << lag_recorder::percentile(lag.raw, 1.0) * 1000 << " ms (own "
                                             << lag_recorder::percentile(lag.own, 1.0) * 1000 << " ms)");
    BOOST_TEST(s.restart_rc == 0);
    BOOST_TEST(recovered);
    BOOST_TEST(s.wrong == 0u);
    BOOST_TEST(s.failed + s.unavailable > 0u, "the restart must have been visible to the workers");
    BOOST_TEST(saw_not_ready, "readiness must have reported PostgreSQL down during the restart");
    BOOST_TEST(health.ready().ok, health.ready().body);
    // No success was a lie: every insert reported as committed is in the table.
    std::string ids = "{";
    for (auto id : s.committed) ids += std::to_string(id) + ",";
    ids.back() = '}';
    auto c = must(co_await s.pool->acquire(), "verify");
    auto n = must(co_await c->query("SELECT count(*) FROM t WHERE id = ANY($1::bigint[])", ids), "count");
    BOOST_TEST(n[0].get<std::int64_t>(0) == static_cast<std::int64_t>(s.committed.size()));
    c.release();
    co_await s.pool->close();
    // Failing connects must never have blocked the loop (they run as PQconnectPoll steps on the loop).
    BOOST_TEST(lag_recorder::percentile(lag.own, 1.0) < 0.1,
               "max loop lag caused by the loop " << lag_recorder::percentile(lag.own, 1.0) * 1000 << " ms");
    lag.probe->stop();
}

BOOST_AUTO_TEST_CASE(pool_recovers_from_a_server_restart) {
    const char* ctl = std::getenv("CHARGEGUARD_TEST_PG_CTL");
    const char* dir = std::getenv("CHARGEGUARD_TEST_PG_DIR");
    BOOST_TEST_REQUIRE((ctl && dir),
                       "CHARGEGUARD_TEST_PG_CTL and CHARGEGUARD_TEST_PG_DIR (ci/lib.sh) say how to restart "
                       "the server");
    pg_fixture f;
    cg::test::scratch_db db("restart");
    std::string cmd = std::string("\"") + ctl + "\" restart \"" + dir + "\" >/dev/null 2>&1";
    cg::test::run_async(
        f.io, [&] { return restart_under_load(f, db.name, cmd); }, 90s);
}

struct lag_run {
    std::shared_ptr<pg::pool> pool;
    int left = 10000;
    int done = 0;
    int wrong = 0;
    int workers = 0;
};

net::awaitable<void> lag_worker(lag_run& s) {
    while (s.left > 0) {
        std::int64_t n = s.left--;
        auto c = must(co_await s.pool->acquire(), "acquire");
        auto r = must(co_await c->query("SELECT $1::int8 + 1, repeat('x', 200)", n), "query");
        if (r[0].get<std::int64_t>(0) != n + 1) ++s.wrong;
        ++s.done;
    }
    --s.workers;
}

net::awaitable<void> queries_keep_the_loop_responsive(pg_fixture& f) {
    lag_run s;
    pg::pool_options o;
    o.server = cg::test::server_config();
    o.size = 2;  // 2 cores: more busy backends would only preempt the loop more
    o.acquire_timeout = 5s;
    s.pool = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
    lag_recorder lag(f.io);
    s.workers = 16;
    for (int i = 0; i < 16; ++i)
        asio::co_spawn(f.io, lag_worker(s), [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    BOOST_TEST_REQUIRE(co_await eventually([&] { return s.workers == 0; }, 60s));
    lag.probe->stop();
    BOOST_TEST(s.done == 10000);
    BOOST_TEST(s.wrong == 0);
    auto raw99 = lag_recorder::percentile(lag.raw, 0.99), own99 = lag_recorder::percentile(lag.own, 0.99);
    BOOST_TEST_MESSAGE("loop lag over " << lag.raw.size() << " ticks: raw p50 "
                                        << lag_recorder::percentile(lag.raw, 0.5) * 1000 << " ms, p99 "
                                        << raw99 * 1000 << " ms, max "
                                        << lag_recorder::percentile(lag.raw, 1.0) * 1000
                                        << " ms; caused by the loop: p99 " << own99 * 1000 << " ms, max "
                                        << lag_recorder::percentile(lag.own, 1.0) * 1000 << " ms");
    BOOST_TEST(lag.raw.size() > 100u);
    BOOST_TEST(lag.have_schedstat(),
               "/proc/thread-self/schedstat is needed to tell preemption from blocking");
    BOOST_TEST(own99 < 0.005, "p99 loop lag caused by the loop " << own99 * 1000 << " ms");
    // The raw figure includes preemption by other processes (PostgreSQL's backends share the 2 cores, and
    // on a shared CI host so do its neighbours): reported above, not asserted.
    co_await s.pool->close();
}

BOOST_AUTO_TEST_CASE(ten_thousand_queries_with_loop_lag_p99_under_5ms) {
    pg_fixture f;
    cg::test::run_async(
        f.io, [&] { return queries_keep_the_loop_responsive(f); }, 90s);
}

}  // namespace
