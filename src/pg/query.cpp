// pg::connection: one operation at a time, single statements (extended protocol) and scripts (simple).
#include "pg/connection_impl.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

result<void> connection::begin_op() {
    if (!conn_ || broken_ || PQstatus(conn_) != CONNECTION_OK) return lost("before sending");
    if (busy_) return error(errc::protocol_error, "connection already has an operation in progress");
    busy_ = true;
    commit_unconfirmed_ = false;
    return {};
}

void connection::end_op(clock::time_point began, const std::error_code& ec, const op& o) {
    busy_ = false;
    // A connection we sent a cancel for is never reused. PostgreSQL's postmaster delivers a cancel as two
    // SIGINTs (to the backend and to its process group); when the first has already ended our statement,
    // the second can land after it and cancel whatever this connection runs next (seen under CPU load:
    // the statement after a timed-out one failing with 57014). Timeouts are rare; a reconnect is cheap.
    if (o.cancel_sent) broken_ = true;
    last_used_ = clock::now();
    if (stats_) stats_->query_done(std::chrono::duration<double>(last_used_ - began).count(), ec);
}

net::awaitable<result<rows>> connection::query_with(std::string_view sql, params p, duration timeout) {
    auto began = clock::now();
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    std::string text(sql);  // libpq wants NUL-terminated SQL
    result<rows> out = error(errc::protocol_error, "no result");
    auto plan = plan_statement(text, p);
    if (plan.prepare) {
        // First use on this connection: Parse once (one extra round trip), then execute by name.
        result<void> prepared;
        if (!PQsendPrepare(conn_, plan.name.c_str(), text.c_str(), p.size(), p.types())) {
            prepared = lost("sending");
        } else if (auto ec = co_await flush(o)) {
            prepared = fail_op(ec, o);
        } else if (auto r = co_await collect(o); !r) {
            prepared = r.err();
        }
        if (!prepared) {
            end_op(began, prepared.code(), o);
            co_return prepared.err();
        }
        prepared_.emplace(plan.key, plan.name);
    }
    if (!send_statement(text, p, plan)) {
        out = lost("sending");
    } else if (auto ec = co_await flush(o)) {
        out = fail_op(ec, o);
    } else {
        out = co_await collect(o);
    }
    if (out && commit_unconfirmed_) out = unconfirmed_commit();
    end_op(began, out.code(), o);
    co_return out;
}

net::awaitable<result<void>> connection::execute(std::string_view sql) {
    return execute(sql, opts_.query_timeout);
}

net::awaitable<result<void>> connection::execute(std::string_view sql, duration timeout) {
    auto began = clock::now();
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    std::string text(sql);
    result<void> out;
    if (!PQsendQuery(conn_, text.c_str())) {
        out = lost("sending");
    } else if (auto ec = co_await flush(o)) {
        out = fail_op(ec, o);
    } else {
        auto r = co_await collect(o);
        if (!r) out = r.err();
    }
    if (out && commit_unconfirmed_) out = unconfirmed_commit();
    end_op(began, out.code(), o);
    co_return out;
}

// Reads the results of one query up to libpq's NULL; returns the last rows or the first error.
net::awaitable<result<rows>> connection::collect(op& o) {
    result<rows> out = error(errc::protocol_error, "the server returned no result");
    bool failed = false;
    for (;;) {
        auto r = co_await next_result(o);
        if (!r) co_return r.err();
        if (!*r) break;
        rows res(*r);  // owns the PGresult from here on
        auto status = PQresultStatus(*r);
        if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK || status == PGRES_EMPTY_QUERY) {
            if (!failed) out = std::move(res);
        } else if (status == PGRES_FATAL_ERROR || status == PGRES_NONFATAL_ERROR) {
            if (!failed) out = result_error(*r, o);
            failed = true;
        } else {
            // COPY and friends are not supported: the connection's protocol state is now unknown.
            broken_ = true;
            co_return error(errc::protocol_error,
                            std::string("unsupported result status ") + PQresStatus(status));
        }
    }
    co_return out;
}

}  // namespace cg::pg
