// The replication settings read from the real test server (no standby): read through the pool, and the
// decision says there is nothing a failover could lose.
#include "pg/replication.hpp"

#include <boost/test/unit_test.hpp>

#include "helpers.hpp"
#include "support.hpp"
#include "support/run_async.hpp"

using namespace cg;
using cg::test::pg_fixture;

BOOST_AUTO_TEST_SUITE(replication)

BOOST_AUTO_TEST_CASE(test_server_without_standby_gives_no_warning) {
    pg_fixture f;
    pg::pool_options o;
    o.server = cg::test::server_config();
    o.size = 1;
    auto p = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), std::move(o), logger());
    auto s = cg::test::run_async(f.io, [&]() -> net::awaitable<pg::replication_settings> {
        auto r = co_await pg::read_replication_settings(p);
        co_await p->close();
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        co_return *r;
    });
    BOOST_TEST(s.synchronous_commit == "on");  // the server's default (ci/pg-cluster sets none)
    BOOST_TEST(s.synchronous_standby_names == "");
    BOOST_TEST(s.standbys == 0);
    auto a = pg::assess_replication(s);
    BOOST_TEST(a.commits_asynchronous);
    BOOST_TEST(!a.async_with_standbys);
}

BOOST_AUTO_TEST_SUITE_END()
