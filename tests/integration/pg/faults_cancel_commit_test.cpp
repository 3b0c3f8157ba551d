// PostgreSQL failing against the real server (faults.hpp): cancel requests stuck on an unreachable
// postmaster never pin the shared offload pool, and a commit whose wait for the synchronous standby was
// cancelled is never reported as success. They stop and SIGSTOP the shared server, so the executable runs
// alone (meson is_parallel: false).
#include <boost/test/unit_test.hpp>

#include "faults.hpp"
#include "standby_cluster.hpp"

using cg::test::cluster_waiting_for_a_standby;

namespace {

// ---- 3. hung cancels do not starve the offload pool -----------------------------------------------------

// Like the Stripe client's work on the offload pool: a chain of timers (request and retry deadlines).
net::awaitable<int> offload_timers() {
    for (int i = 0; i < 5; ++i) co_await net::sleep_for(100ms);
    co_return 5;
}

net::awaitable<result<pg::rows>> sleep_query(std::shared_ptr<pg::connection> c) {
    co_return co_await c->query("SELECT pg_sleep(5)");
}

net::awaitable<void> cancels_off_the_offload_pool(pg_fixture& f, const server_ctl& srv) {
    pg::connection_options co;
    co.query_timeout = 300ms;
    co.cancel_grace = 300ms;
    auto cfg = cg::test::server_config();
    std::vector<std::shared_ptr<pg::connection>> conns;
    for (int i = 0; i < 2; ++i)
        conns.push_back(must(co_await pg::connection::connect(cfg, f.offload.get_executor(), co), "connect"));
    auto before = pg::cancels_in_flight();

    // The postmaster stops answering: a cancel request now connects (the kernel accepts into the backlog)
    // and then waits forever for the postmaster to close it.
    stopped_process stall(srv.postmaster(), 8s);
    std::vector<std::optional<result<pg::rows>>> out(conns.size());
    int finished = 0;
    for (std::size_t i = 0; i < conns.size(); ++i)
        asio::co_spawn(f.io, net::boxed(sleep_query(conns[i])),
                       [&out, &finished, i](std::exception_ptr e, std::optional<result<pg::rows>> r) {
                           if (e) std::rethrow_exception(e);
                           out[i] = std::move(r);
                           ++finished;
                       });
    // Both queries time out and send their cancels (the shared pool has exactly two threads).
    co_await eventually([&]() -> net::awaitable<bool> { co_return pg::cancels_in_flight() >= before + 2; },
                        5s);
    BOOST_TEST(pg::cancels_in_flight() >= before + 2,
               "both cancel requests should be stuck on the postmaster");

    auto began = sclock::now();
    auto work = co_await net::with_timeout(net::offload(f.offload.get_executor(), offload_timers()), 3s);
    double took = seconds_since(began);
    BOOST_TEST(work.has_value(), "offload work did not finish within 3 s while cancels were stuck");
    BOOST_TEST(took < 1.5, "offload work took " << took << " s (0.5 s of timers)");
    BOOST_TEST_MESSAGE("offload work with two stuck cancels: " << took << " s");

    co_await eventually([&]() -> net::awaitable<bool> { co_return finished == 2; }, 5s);
    BOOST_TEST_REQUIRE(finished == 2);
    for (auto& r : out) {
        BOOST_TEST_REQUIRE(r.has_value());
        BOOST_TEST(!r->has_value());
        if (!r->has_value()) BOOST_TEST((r->code() == pg::errc::timeout), r->err().describe());
    }
    for (auto& c : conns) BOOST_TEST(c->broken());

    stall.resume();
    bool drained = co_await eventually(
        [&]() -> net::awaitable<bool> { co_return pg::cancels_in_flight() == before; }, 10s);
    BOOST_TEST(drained, "the stuck cancels should finish once the postmaster runs again");
}

BOOST_AUTO_TEST_CASE(stuck_cancel_requests_do_not_starve_the_offload_pool) {
    server_ctl srv;
    pg_fixture f;
    cg::test::run_async(
        f.io, [&] { return cancels_off_the_offload_pool(f, srv); }, 60s);
}

// ---- 4. a commit the synchronous standby never confirmed is not a success ----------------------------

// PostgreSQL answers a cancel during a commit's wait for the standby with a WARNING and the command's
// success, the row committed on the primary only. Our deadline's cancel must turn that into an error.
net::awaitable<void> unconfirmed_commits(pg_fixture& f, const cluster_waiting_for_a_standby& srv) {
    pg::connection_options opts;
    opts.query_timeout = 300ms;
    auto cfg = test::server_config(srv.dsn());
    auto connect = [&]() -> net::awaitable<std::unique_ptr<pg::connection>> {
        co_return must(co_await pg::connection::connect(cfg, f.offload.get_executor(), opts), "connect");
    };
    // The server applies the setting a moment after the reload: until then commits do not wait, and a
    // statement succeeds honestly. Each try is a fresh id on a fresh connection (a cancelled one is dropped).
    int id = 0;
    result<pg::rows> single = error(pg::errc::protocol_error, "not run");
    auto until = sclock::now() + 15s;
    for (;;) {
        auto c = co_await connect();
        single = co_await c->query("INSERT INTO t (id) VALUES ($1)", ++id);
        if (!single || sclock::now() > until) break;
    }
    BOOST_TEST_REQUIRE(!single.has_value(), "a commit the standby never confirmed was reported as success");
    BOOST_TEST((single.code() == pg::errc::timeout), single.err().describe());
    BOOST_TEST(single.err().describe().find("synchronous standby") != std::string::npos,
               single.err().describe());

    // A pipeline batch (the ledger's group commit) too.
    auto c = co_await connect();
    pg::pipeline batch;
    batch.add("INSERT INTO t (id) VALUES ($1)", 1000);
    batch.add("INSERT INTO t (id) VALUES ($1)", 1001);
    auto many = co_await c->run(batch);
    BOOST_TEST_REQUIRE(!many.has_value(), "a batch the standby never confirmed was reported as success");
    BOOST_TEST((many.code() == pg::errc::timeout), many.err().describe());
    co_return;
}

BOOST_AUTO_TEST_CASE(commit_unconfirmed_by_the_synchronous_standby_is_an_error) {
    pg_fixture f;
    cluster_waiting_for_a_standby srv;
    cg::test::run_async(
        f.io, [&] { return unconfirmed_commits(f, srv); }, 60s);
    // What the server did with them: committed locally, which is why success would be a lie a failover
    // exposes. A read does not wait for the standby.
    BOOST_TEST(srv.exec("SELECT count(*) FROM t WHERE id >= 1000") == "2");
}

}  // namespace
