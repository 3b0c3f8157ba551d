#include "pg/replication.hpp"

namespace cg::pg {

replication_assessment assess_replication(const replication_settings& s) {
    replication_assessment a;
    bool waits_for_standby = s.synchronous_commit == "on" || s.synchronous_commit == "remote_write" ||
                             s.synchronous_commit == "remote_apply";
    a.commits_asynchronous = s.synchronous_standby_names.empty() || !waits_for_standby;
    a.async_with_standbys = a.commits_asynchronous && s.standbys > 0;
    a.why = "synchronous_commit=" + s.synchronous_commit + " synchronous_standby_names='" +
            s.synchronous_standby_names + "' standbys=" + std::to_string(s.standbys) +
            " sync_standbys=" + std::to_string(s.sync_standbys);
    return a;
}

namespace {
const std::string replication_sql =
    "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), "
    "(SELECT count(*) FROM pg_stat_replication), "
    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))";
}  // namespace

net::awaitable<result<replication_settings>> read_replication_settings(std::shared_ptr<pool> p) {
    auto r = co_await exec_pooled(std::move(p), replication_sql, params(), acquire_mode::wait_for_server);
    if (!r) co_return r.err();
    replication_settings s;
    s.synchronous_commit = r->get<std::string>(0, 0);
    s.synchronous_standby_names = r->get<std::string>(0, 1);
    s.standbys = r->get<std::int64_t>(0, 2);
    s.sync_standbys = r->get<std::int64_t>(0, 3);
    co_return s;
}

}  // namespace cg::pg
