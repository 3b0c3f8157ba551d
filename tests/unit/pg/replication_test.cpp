// The replication-settings decision (pg/replication.hpp), table-driven.
#include "pg/replication.hpp"

#include <boost/test/unit_test.hpp>

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
