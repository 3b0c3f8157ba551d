// The pool's watch for failovers (pool.hpp, pool_options::watch_failover and failover_record): each new
// connection's server identity, compared with the last one this pool reached and with the one the database
// recorded last, and the listeners told of a change.
#include <algorithm>
#include <string>

#include "pg/pool.hpp"
#include "pg/rows.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using std::chrono::milliseconds;

std::string failover_cause(const server_identity& before, const server_identity& now) {
    if (now.in_recovery) return {};
    if (!before.system_identifier.empty() && !now.system_identifier.empty() &&
        before.system_identifier != now.system_identifier)
        return "another cluster (system identifier " + now.system_identifier + ", was " +
               before.system_identifier + ")";
    if (before.in_recovery) return "the server was a standby and is now a primary";
    if (before.timeline > 0 && now.timeline > 0 && before.timeline != now.timeline)
        return "a new WAL timeline " + std::to_string(now.timeline) + " (was " +
               std::to_string(before.timeline) + "): a standby was promoted";
    if (!before.address.empty() && !now.address.empty() && before.address != now.address)
        return "another server address " + now.address + " (was " + before.address + ")";
    return {};
}

namespace {
// The timeline of a primary is the first 8 hex digits of its current WAL file's name (pg_walfile_name may not
// run in recovery); pg_control_checkpoint()'s timeline would lag a promotion until its first checkpoint.
const std::string identity_sql =
    "SELECT (SELECT system_identifier FROM pg_control_system())::text, pg_is_in_recovery(), "
    "CASE WHEN pg_is_in_recovery() THEN 0::bigint "
    "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END, "
    "coalesce(host(inet_server_addr()) || ':' || inet_server_port()::text, 'local')";
}  // namespace

void pool::on_failover(std::function<void(const failover_event&)> f) {
    failover_listeners_.push_back(std::move(f));
}

net::awaitable<void> pool::note_identity(connection& c) {
    auto timeout = std::min<milliseconds>(opts_.conn.query_timeout, milliseconds(2000));
    if (timeout <= milliseconds::zero()) timeout = milliseconds(2000);
    auto r = co_await c.query_with(identity_sql, params(), timeout);
    if (!r || r->size() != 1) {
        // Not a verdict on the connection (its next statement tells); only this connect goes unchecked.
        log_.warn("could not read the server's identity: a failover on this connect would go unnoticed",
                  {{"error", r ? std::string("no row") : r.err().describe()}});
        co_return;
    }
    server_identity now;
    now.system_identifier = r->get<std::string>(0, 0);
    now.in_recovery = r->get<bool>(0, 1);
    now.timeline = r->get<std::int64_t>(0, 2);
    now.address = r->get<std::string>(0, 3);
    if (!identity_) {
        log_.info("connected to PostgreSQL", {{"system_identifier", now.system_identifier},
                                              {"timeline", now.timeline},
                                              {"in_recovery", now.in_recovery},
                                              {"server_address", now.address}});
        identity_ = now;
        if (record_due()) co_await record_identity(c, now, false);
        co_return;
    }
    auto cause = failover_cause(*identity_, now);
    if (now.in_recovery) co_return;  // a standby: not where commits go, and not what later ones compare with
    const bool seen = !cause.empty();
    if (seen) {
        failed_over_in_memory_ = true;
        report_failover({*identity_, now, std::move(cause)});
    }
    identity_ = now;
    if (record_due()) co_await record_identity(c, now, seen);
}

bool pool::record_due() const noexcept {
    if (opts_.failover_record.empty() || !identity_ || identity_->in_recovery) return false;
    return !recorded_ || recorded_->system_identifier != identity_->system_identifier ||
           recorded_->timeline != identity_->timeline;
}

void pool::report_failover(failover_event ev) {
    if (stats_) stats_->failovers.Increment();
    log_.warn("PostgreSQL failed over: commits acknowledged by the previous server may be lost",
              {{"cause", ev.cause},
               {"system_identifier", ev.now.system_identifier},
               {"timeline", ev.now.timeline},
               {"server_address", ev.now.address}});
    // A copy: a listener may register another.
    auto listeners = failover_listeners_;
    for (auto& f : listeners) f(ev);
}

namespace {
// The record before this statement (no row: none yet), and the server reached written in its place when it
// differs. Two pools recording the same change at once both read the old record (the second waits for the
// first's row lock, its snapshot taken before), so each reports the failover.
const std::string record_identity_sql =
    "WITH prev AS (SELECT system_identifier, timeline FROM pg_server_seen WHERE name = $1::text), "
    "up AS (INSERT INTO pg_server_seen AS s (name, system_identifier, timeline) "
    "VALUES ($1::text, $2::text, $3::bigint) ON CONFLICT (name) DO UPDATE "
    "SET system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline, seen_at = now() "
    "WHERE s.system_identifier <> EXCLUDED.system_identifier OR s.timeline <> EXCLUDED.timeline) "
    "SELECT system_identifier, timeline FROM prev";
}  // namespace

net::awaitable<void> pool::record_identity(connection& c, const server_identity& now, bool seen) {
    // One comparison at a time: two connects at once would both read the old record and report it twice.
    if (recording_) co_return;
    recording_ = true;
    struct done_guard {
        bool& flag;
        ~done_guard() { flag = false; }
    } done{recording_};
    auto timeout = std::min<milliseconds>(opts_.conn.query_timeout, milliseconds(2000));
    if (timeout <= milliseconds::zero()) timeout = milliseconds(2000);
    auto r = co_await c.query_with(
        record_identity_sql, params(opts_.failover_record, now.system_identifier, now.timeline), timeout);
    if (!r) {
        log_.debug("could not compare the server with the recorded one (tried again later)",
                   {{"error", r.err().describe()}});
        co_return;
    }
    // Another connect may have moved on meanwhile: only what this one saw is recorded as compared.
    recorded_ = now;
    // Once this pool saw a failover itself, the record can only name a server it already reported (a retry
    // of a comparison that failed at that connect would report it twice).
    if (seen || failed_over_in_memory_ || r->size() != 1) co_return;
    server_identity before;
    before.system_identifier = r->get<std::string>(0, 0);
    before.timeline = r->get<std::int64_t>(0, 1);
    auto cause = failover_cause(before, now);
    if (cause.empty()) co_return;
    report_failover({std::move(before), now, cause + ", since the server recorded last"});
}

}  // namespace cg::pg
