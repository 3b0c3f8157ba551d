// A batch of parameterised statements sent in one go (libpq pipeline mode). Build it, then
// `co_await conn.run(batch)`: results come back in order, one per statement.
//
// Transactions: PostgreSQL runs everything between two syncs as one implicit transaction.
//  * sync_mode::per_batch (default): one PQpipelineSync ends the batch, so the batch is all-or-nothing. If
//    statement k fails, k reports its error, every later statement errc::pipeline_aborted (not executed),
//    and every earlier statement errc::rolled_back (it ran, but its effects were undone). The batch must
//    not contain BEGIN/COMMIT/ROLLBACK (if it does, earlier results are reported as the server gave them).
//  * sync_mode::per_statement: a sync after every statement, so each commits on its own and a failure
//    touches only its own statement (independent writes, e.g. one billing pre-flight per message).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg/params.hpp"

namespace cg::pg {

class pipeline {
  public:
    enum class sync_mode { per_batch, per_statement };
    explicit pipeline(sync_mode m = sync_mode::per_batch) noexcept : mode_(m) {}
    sync_mode mode() const noexcept { return mode_; }

    struct statement {
        std::string sql;
        params args;
    };

    // Appends a statement: batch.add("INSERT … VALUES ($1, $2)", key, amount).
    template <typename... A>
    pipeline& add(std::string_view sql, A&&... args) {
        statements_.push_back({std::string(sql), params(std::forward<A>(args)...)});
        return *this;
    }
    pipeline& add_params(std::string sql, params p) {
        statements_.push_back({std::move(sql), std::move(p)});
        return *this;
    }

    std::size_t size() const noexcept { return statements_.size(); }
    bool empty() const noexcept { return statements_.empty(); }
    void clear() noexcept { statements_.clear(); }
    void reserve(std::size_t n) { statements_.reserve(n); }
    const std::vector<statement>& statements() const noexcept { return statements_; }

  private:
    sync_mode mode_;
    std::vector<statement> statements_;
};

}  // namespace cg::pg
