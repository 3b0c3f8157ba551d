// The replication-settings decision (pg/replication.hpp) and what the pool counts as a failover
// (pg::failover_cause), table-driven.
#include "pg/replication.hpp"

#include <boost/test/unit_test.hpp>

#include "pg/pool.hpp"

using cg::pg::assess_replication;
using cg::pg::replication_settings;

BOOST_AUTO_TEST_CASE(asynchronous_commits_with_standbys_are_flagged) {
    struct row {
        std::string commit, names;
        std::int64_t standbys;
        bool async, warn;
    };
    const row rows[] = {
        {"on", "", 0, true, false},  // a lone server: nothing to lose to a failover
        {"on", "", 1, true, true},   // the default with a streaming standby: the loss
        {"off", "", 2, true, true},
        {"local", "'*'", 1, true, true},  // names set, but commits never wait for them
        {"off", "ANY 1 (a, b)", 2, true, true},
        {"on", "ANY 1 (a, b)", 2, false, false},  // synchronous
        {"remote_apply", "b", 1, false, false},
        {"remote_write", "FIRST 1 (b)", 1, false, false},
        {"on", "b", 0, false, false},  // synchronous, standby gone: commits wait, none lost
    };
    for (const auto& r : rows) {
        replication_settings s{r.commit, r.names, r.standbys, 0};
        auto a = assess_replication(s);
        BOOST_TEST(a.commits_asynchronous == r.async, r.commit << " '" << r.names << "' " << r.standbys);
        BOOST_TEST(a.async_with_standbys == r.warn, r.commit << " '" << r.names << "' " << r.standbys);
        BOOST_TEST(a.why.find("synchronous_commit=" + r.commit) != std::string::npos);
        BOOST_TEST(a.why.find("synchronous_standby_names") != std::string::npos);
    }
}

// What makes a new connection's server another one than the last (pg::failover_cause), table-driven.
BOOST_AUTO_TEST_CASE(a_failover_is_another_cluster_timeline_address_or_a_promoted_standby) {
    using cg::pg::failover_cause;
    using cg::pg::server_identity;
    const server_identity primary{"7001", 1, false, "10.0.0.1:5432"};
    struct row {
        const char* what;
        server_identity now;
        std::string cause;  // a word the cause must hold; empty: no failover
    };
    const row rows[] = {
        {"the same server again (a restart)", primary, ""},
        {"its promoted standby", {"7001", 2, false, "10.0.0.2:5432"}, "timeline 2"},
        {"a promoted standby behind the same address", {"7001", 2, false, "10.0.0.1:5432"}, "timeline 2"},
        {"another cluster", {"8002", 1, false, "10.0.0.1:5432"}, "another cluster"},
        {"the same cluster at another address",
         {"7001", 1, false, "10.0.0.3:5432"},
         "another server address"},
        {"a standby (read-only)", {"7001", 0, true, "10.0.0.2:5432"}, ""},
        {"a server that could not say its timeline", {"7001", 0, false, "10.0.0.1:5432"}, ""},
    };
    for (const auto& r : rows) {
        auto cause = failover_cause(primary, r.now);
        if (r.cause.empty())
            BOOST_TEST(cause.empty(), r.what << ": " << cause);
        else
            BOOST_TEST(cause.find(r.cause) != std::string::npos, r.what << ": " << cause);
    }
    // A standby first, then the same cluster writable: it was promoted.
    const server_identity standby{"7001", 0, true, "10.0.0.2:5432"};
    BOOST_TEST(failover_cause(standby, {"7001", 2, false, "10.0.0.2:5432"}).find("standby") !=
               std::string::npos);
    BOOST_TEST(failover_cause(standby, standby).empty());
}
