// pg::connection: pipeline batches (libpq pipeline mode), their syncs and what a failure undoes.
#include <optional>
#include <unordered_map>

#include "pg/connection_impl.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

net::awaitable<result<std::vector<result<rows>>>> connection::run(const pipeline& batch) {
    return run(batch, opts_.query_timeout);
}

net::awaitable<result<std::vector<result<rows>>>> connection::run(const pipeline& batch, duration timeout) {
    auto began = clock::now();
    if (batch.empty()) co_return std::vector<result<rows>>{};
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    const bool sync_each = batch.mode() == pipeline::sync_mode::per_statement;
    result<std::vector<result<rows>>> out = error(errc::protocol_error, "pipeline not run");
    std::vector<stmt_plan> plans;
    if (!PQenterPipelineMode(conn_)) {
        out = error(errc::protocol_error, "could not enter pipeline mode: " + conn_message());
    } else {
        // Everything is queued in libpq's output buffer first (nonblocking mode never blocks here); flush()
        // then sends it while reading whatever the server already answered.
        bool queued = true;
        plans.reserve(batch.size());
        std::unordered_map<std::string, std::string> preparing;  // first Parse of each new statement only
        for (const auto& s : batch.statements()) {
            const auto& p = s.args;
            auto plan = plan_statement(s.sql, p);
            if (plan.prepare) {
                if (auto it = preparing.find(plan.key); it != preparing.end()) {
                    plan.name = it->second;  // parsed earlier in this batch
                    plan.prepare = false;
                } else {
                    preparing.emplace(plan.key, plan.name);
                    queued = PQsendPrepare(conn_, plan.name.c_str(), s.sql.c_str(), p.size(), p.types());
                }
            }
            queued = queued && send_statement(s.sql, p, plan) && (!sync_each || PQpipelineSync(conn_));
            plans.push_back(std::move(plan));
            if (!queued) break;
        }
        if (!queued || (!sync_each && !PQpipelineSync(conn_))) {
            out = lost("queueing the pipeline");
        } else if (auto ec = co_await flush(o)) {
            out = fail_op(ec, o);
        } else {
            out = co_await collect_pipeline(o, batch, plans);
        }
        if (!out) broken_ = true;  // stuck in pipeline mode with unread results: unusable
    }
    if (out && commit_unconfirmed_) out = unconfirmed_commit();
    end_op(began, out.code(), o);
    co_return out;
}

net::awaitable<result<void>> connection::expect_sync(op& o) {
    auto sync = co_await next_result(o);
    if (!sync) co_return sync.err();
    rows owner(*sync);
    if (!*sync || PQresultStatus(*sync) != PGRES_PIPELINE_SYNC)
        co_return error(errc::protocol_error, "pipeline: missing sync result");
    co_return result<void>{};
}

net::awaitable<result<void>> connection::read_prepare(op& o, const stmt_plan& plan) {
    auto r = co_await next_result(o);
    if (!r) co_return r.err();
    if (!*r) co_return error(errc::protocol_error, "pipeline: missing prepare result");
    rows owner(*r);
    result<void> out;
    switch (PQresultStatus(*r)) {
        case PGRES_COMMAND_OK:
            prepared_.emplace(plan.key, plan.name);
            break;
        case PGRES_PIPELINE_ABORTED:
            out = error(errc::pipeline_aborted, "prepare skipped");
            break;
        case PGRES_FATAL_ERROR:
            out = result_error(*r, o);
            break;
        default:
            co_return error(errc::protocol_error, "pipeline: unexpected prepare result");
    }
    auto end = co_await next_result(o);
    if (!end) co_return end.err();
    if (*end) {
        rows extra(*end);
        co_return error(errc::protocol_error, "pipeline: more than one prepare result");
    }
    co_return out;
}

net::awaitable<result<std::vector<result<rows>>>> connection::collect_pipeline(
    op& o, const pipeline& batch, const std::vector<stmt_plan>& plans) {
    const bool sync_each = batch.mode() == pipeline::sync_mode::per_statement;
    const std::size_t n = batch.size();
    std::vector<result<rows>> out;
    out.reserve(n);
    std::size_t first_failure = n;
    bool txn_control = false;  // an explicit BEGIN/COMMIT/ROLLBACK changes what a failure undoes
    for (std::size_t i = 0; i < n; ++i) {
        std::optional<error> prepare_failed;
        if (plans[i].prepare) {
            auto pr = co_await read_prepare(o, plans[i]);
            if (!pr && pr.code() != errc::pipeline_aborted && pr.code().category() == category() &&
                (pr.code() == errc::connection_lost || pr.code() == errc::timeout ||
                 pr.code() == errc::canceled || pr.code() == errc::protocol_error))
                co_return pr.err();
            if (!pr && pr.code() != errc::pipeline_aborted) prepare_failed = pr.err();
        }
        auto r = co_await next_result(o);
        if (!r) co_return r.err();
        if (!*r)
            co_return error(errc::protocol_error,
                            "pipeline: missing result for statement " + std::to_string(i));
        rows res(*r);
        if (prepare_failed) {  // the execute was skipped; the statement's error is the Parse error
            if (stats_) stats_->error(prepare_failed->code);
            if (first_failure == n) first_failure = i;
            out.emplace_back(std::move(*prepare_failed));
        } else
            switch (PQresultStatus(*r)) {
                case PGRES_TUPLES_OK:
                case PGRES_COMMAND_OK: {
                    auto tag = res.command();
                    if (tag == "BEGIN" || tag == "COMMIT" || tag == "ROLLBACK" || tag == "START TRANSACTION")
                        txn_control = true;
                    out.emplace_back(std::move(res));
                    break;
                }
                case PGRES_PIPELINE_ABORTED:
                    out.emplace_back(error(errc::pipeline_aborted, "statement " + std::to_string(i)));
                    break;
                case PGRES_FATAL_ERROR: {
                    auto e = result_error(*r, o);
                    if (stats_) stats_->error(e.code);
                    if (first_failure == n) first_failure = i;
                    out.emplace_back(std::move(e));
                    break;
                }
                default:
                    co_return error(errc::protocol_error, std::string("pipeline: unexpected result status ") +
                                                              PQresStatus(PQresultStatus(*r)));
            }
        auto end = co_await next_result(o);  // each statement's results end with NULL
        if (!end) co_return end.err();
        if (*end) {
            rows extra(*end);
            co_return error(errc::protocol_error,
                            "pipeline: more than one result for statement " + std::to_string(i));
        }
        if (sync_each)
            if (auto s = co_await expect_sync(o); !s) co_return s.err();
    }
    if (!sync_each)
        if (auto s = co_await expect_sync(o); !s) co_return s.err();
    if (!PQexitPipelineMode(conn_))
        co_return error(errc::protocol_error, "could not leave pipeline mode: " + conn_message());
    // One sync = one implicit transaction: a failure undid everything before it.
    if (!sync_each && first_failure < n && !txn_control)
        for (std::size_t i = 0; i < first_failure; ++i)
            out[i] = error(errc::rolled_back, "statement " + std::to_string(i) + " undone: statement " +
                                                  std::to_string(first_failure) + " of the batch failed");
    co_return out;
}

}  // namespace cg::pg
