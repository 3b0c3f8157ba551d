// The cluster's replication settings, as the ledger's durability depends on them (docs/operating/
// ha-postgres.md). With asynchronous commits and a standby attached, a failover loses the commits the standby
// had not received yet: a settle chargeguard already FINed for, or a pre-flight insert. The sweeper and the
// backfill repair what they can; synchronous replication avoids the loss.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::pg {

// What the server says (SHOW synchronous_commit, SHOW synchronous_standby_names, pg_stat_replication).
struct replication_settings {
    std::string synchronous_commit;         // on | remote_apply | remote_write | local | off
    std::string synchronous_standby_names;  // empty: no synchronous standby
    std::int64_t standbys = 0;              // streaming standbys attached (pg_stat_replication rows)
    std::int64_t sync_standbys = 0;         // of those, sync_state sync or quorum
};

struct replication_assessment {
    // Commits return before any standby has them while standbys are attached: a failover loses them.
    bool async_with_standbys = false;
    // Commits wait for no standby at all (whether or not one is attached).
    bool commits_asynchronous = false;
    std::string why;  // one line naming the settings, for the log
};

// Pure: commits are synchronous only with synchronous_standby_names set and synchronous_commit one of on,
// remote_write, remote_apply (local and off never wait for a standby). Table-tested.
replication_assessment assess_replication(const replication_settings& s);

// Reads the settings on a pooled connection (asynchronously; the pool's executor). Errors as the pool's.
// pg_stat_replication lists standbys to superusers and pg_monitor members; for others its rows still
// count them.
net::awaitable<result<replication_settings>> read_replication_settings(std::shared_ptr<pool> p);

}  // namespace cg::pg
