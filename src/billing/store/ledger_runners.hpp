// The ledger's batched statements (billing/store/ledger_batch.hpp runs them): a group-commit runner each for
// the pre-flight insert and the settle update, and the one-row statements they fall back to. Internal to the
// ledger (billing/store/ledger.cpp) and the corrections ledger (billing/store/correction_ledger.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "billing/store/ledger.hpp"
#include "pg/pool.hpp"
#include "pg/rows.hpp"

namespace cg::billing::ledger_detail {

// A row of ledger_sql's record columns.
ledger_record decode_record(const pg::rows& r, std::size_t i);

// One statement on a pooled connection. `sql` is one of ledger_sql's statics (it outlives the call).
net::awaitable<result<pg::rows>> exec(std::shared_ptr<pg::pool> pool, const std::string& sql, pg::params p);

// One lease-extending statement (ledger_sql.hpp take_sql says why): as exec(), with the statement's deadline
// appended as the last parameter; the statement returns one row whose column `late_col` says whether the
// database saw it after that deadline. Returns that row, or errc::timeout when it came late and changed
// nothing (its first column NULL). Also the corrections ledger's (correction_ledger.cpp).
net::awaitable<result<pg::rows>> exec_with_deadline(std::shared_ptr<pg::pool> pool, const std::string& sql,
                                                    pg::params p, int late_col);

struct preflight_req {
    new_record rec;
    std::int64_t lease_ms = 0;
};
struct preflight_out {
    bool inserted = false;
    // inserted: the new row; a conflict: the existing row when the batch read it (else the caller reads it).
    // Held by pointer: the result passes through several hands (runner, batch, caller) on its way.
    std::unique_ptr<ledger_record> row;
    // A conflict the batch did not read the row of: the request, given back for the caller's own read.
    std::optional<new_record> unread;
};

net::awaitable<result<preflight_out>> preflight_insert_one(std::shared_ptr<pg::pool> pool,
                                                           const preflight_req& q);

struct preflight_runner {
    static std::string_view key(const preflight_req& q) noexcept { return q.rec.key; }
    static net::awaitable<std::vector<result<preflight_out>>> run(std::shared_ptr<pg::pool> pool,
                                                                  std::vector<preflight_req>& reqs);
    // run() but for the requests given back (the insert, or the single-row statements, and the batch's
    // conflict read).
    static net::awaitable<std::vector<result<preflight_out>>> run_statements(
        std::shared_ptr<pg::pool> pool, std::vector<preflight_req>& reqs);
    // The existing rows of the batch's conflicts its statement could not read (committed after its snapshot),
    // one statement for all of them. A failed read leaves them to the callers' own.
    static net::awaitable<void> read_conflicts(std::shared_ptr<pg::pool> pool,
                                               const std::vector<preflight_req>& reqs,
                                               std::vector<preflight_out>& rows);
};

struct settle_req {
    std::string key;
    record_status status;
    std::optional<std::string> charge_id;
    std::optional<std::string> last_error;
    std::optional<std::string> payment_intent_id;
};

net::awaitable<result<bool>> settle_one(std::shared_ptr<pg::pool> pool, const settle_req& q);

struct settle_runner {
    static std::string_view key(const settle_req& q) noexcept { return q.key; }
    static net::awaitable<std::vector<result<bool>>> run(std::shared_ptr<pg::pool> pool,
                                                         std::vector<settle_req>& reqs);
};

}  // namespace cg::billing::ledger_detail
