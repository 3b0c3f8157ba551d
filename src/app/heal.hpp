// consume's self-healing ledger (docs/operating/ha-postgres.md): the sweeper for abandoned pending rows
// (billing/heal/sweeper.hpp) and the startup check of PostgreSQL's replication settings (pg/replication.hpp).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "app/runtime.hpp"
#include "billing/flow/charge_flow.hpp"
#include "nsq/consumer.hpp"
#include "pg/pool.hpp"

namespace cg::billing {
class pending_age_monitor;
}
namespace cg::stripe {
class client;
}

namespace cg::app {

struct heal_flags {
    bool sweep = true;
    std::string sweep_after = "auto";     // the sweep bound; auto: derived (billing::sweep_bound)
    std::string sweep_interval = "auto";  // auto: a quarter of the bound within [1 s, 60 s]
    std::string backfill_window = "1h";   // 0: no backfill
    std::string backfill_interval = "10m";
    // Connected accounts the backfill always searches: a list (acct_…, separated by commas or blanks) and a
    // file of them (one or more a line, '#' starts a comment).
    std::string connect_accounts;
    std::string connect_accounts_file;
};

// The accounts of --connect-accounts and --connect-accounts-file, in order, each once. Throws
// CLI::ValidationError naming the flag on a name that is not acct_… or a file that cannot be read.
std::vector<std::string> connect_accounts_of(const heal_flags& f);

// --sweep, --sweep-after, --sweep-interval, --backfill-window, --backfill-interval, --connect-accounts,
// --connect-accounts-file.
void add_heal_flags(CLI::App& cmd, heal_flags& f);

// Starts the sweeper (unless --sweep=false), the backfill (unless --backfill-window=0) and the replication
// check on the runtime's loop; they stop on its shutdown. `p`, `pool`, `stripe` and `age` must outlive the
// runtime's run(). Throws CLI::ValidationError on a bad
// flag. The check logs a warning and sets chargeguard_pg_async_replication to 1 when commits are
// asynchronous with standbys attached (0 otherwise); it retries until PostgreSQL answers.
void start_ledger_healing(runtime& rt, billing::charge_flow& p, std::shared_ptr<pg::pool> pool,
                          stripe::client& stripe, const heal_flags& f, const nsq::consumer_config& ncfg,
                          billing::pending_age_monitor* age);

}  // namespace cg::app
