// One PostgreSQL connection driven asynchronously through libpq (docs/contributing.md "libpq"): libpq owns
// the socket, we only wait on it. Not thread-safe: use it from the executor it was connected on (the main
// io_context), one operation at a time.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/config.hpp"
#include "pg/error.hpp"
#include "pg/params.hpp"
#include "pg/pipeline.hpp"
#include "pg/rows.hpp"

struct pg_conn;    // libpq's PGconn
struct pg_result;  // libpq's PGresult

namespace cg::pg {

class stats;

enum class tx_status { idle, active, in_transaction, in_error, unknown };

struct connection_options {
    // Deadline of query()/execute()/run() unless given explicitly; zero means none. On expiry the query is
    // cancelled server-side (a cancel request on a dedicated thread, cancel.hpp) and the call returns
    // errc::timeout.
    std::chrono::milliseconds query_timeout{5000};
    // After a timeout's cancel: how long to wait for the server to end the query (errc::timeout either way).
    // The connection is dropped afterwards in every case: a connection we sent a cancel for is never reused
    // (a late second SIGINT from the postmaster could cancel its next statement), and one whose server did
    // not answer in time is closed abortively so nothing it still queued can reach the server later.
    std::chrono::milliseconds cancel_grace{1000};
    // Statements are prepared once per connection (named, keyed by SQL text and parameter types) and then
    // executed by name: PostgreSQL parses and plans them once instead of on every call. Up to this many per
    // connection; beyond, statements run unnamed. Zero disables preparing.
    std::size_t max_prepared = 256;
};

class connection {
  public:
    using clock = std::chrono::steady_clock;
    using duration = clock::duration;

    // Resolves each endpoint's host with Asio (libpq gets `hostaddr`, so it never does DNS), connects with
    // PQconnectStartParams/PQconnectPoll under cfg.connect_timeout per attempt, then sets nonblocking mode.
    // Returns the connection, or errc::connection_failed / errc::auth_failed with libpq's message, or
    // errc::canceled. Cancellable through the awaiting coroutine's cancellation slot. Completes on the
    // caller's executor, which the connection then belongs to. `offload` (where PQfinish runs) must outlive
    // the connection; `cfg` must outlive the call.
    static net::awaitable<result<std::unique_ptr<connection>>> connect(const config& cfg,
                                                                       asio::any_io_executor offload,
                                                                       connection_options opts = {},
                                                                       logger log = {},
                                                                       std::shared_ptr<stats> st = nullptr);

    ~connection();  // releases the socket (never closes it) and runs PQfinish on the offload pool
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    // Runs one parameterised statement (extended protocol, text parameters, text results):
    //   auto r = co_await conn.query("SELECT x FROM t WHERE k = $1", key);
    // Returns the rows, or an error whose code says what happened: a SQLSTATE category (unique_violation,
    // serialization_failure, …), errc::timeout (cancelled server-side after options().query_timeout),
    // errc::connection_lost (outcome unknown), errc::canceled (the caller's cancellation slot fired: the
    // connection is then broken). Completes on the connection's executor. `sql` must stay valid until the
    // call completes (a literal, or a temporary in the co_await expression).
    template <typename... A>
    net::awaitable<result<rows>> query(std::string_view sql, A&&... args) {
        return query_with(sql, params(std::forward<A>(args)...), opts_.query_timeout);
    }
    // As query(), with prepared params and an explicit timeout (zero: none).
    net::awaitable<result<rows>> query_with(std::string_view sql, params p, duration timeout);

    // Runs a script of one or more statements without parameters (simple protocol; migrations, SET, …).
    // Stops at the first error, which it returns. Same cancellation/executor rules as query().
    net::awaitable<result<void>> execute(std::string_view sql);
    net::awaitable<result<void>> execute(std::string_view sql, duration timeout);

    // Sends every statement of `batch` in pipeline mode with the batch's syncs (pipeline.hpp says what each
    // sync mode means for transactions), then reads the results in order. The outer result fails only when
    // the connection failed (connection_lost, timeout, canceled: outcome unknown); otherwise there is one
    // inner result per statement: its rows, its own error, errc::pipeline_aborted (skipped after a failure)
    // or errc::rolled_back (per_batch mode: undone by a later failure). `batch` must outlive the call.
    net::awaitable<result<std::vector<result<rows>>>> run(const pipeline& batch);
    net::awaitable<result<std::vector<result<rows>>>> run(const pipeline& batch, duration timeout);

    tx_status transaction_status() const noexcept;
    // A broken connection (lost, timed out — whether or not the server answered the cancel within the grace
    // —, cancelled by the caller mid-operation) must be dropped.
    bool broken() const noexcept { return broken_; }
    // Non-blocking liveness check for an idle connection: consumes anything the server sent meanwhile and
    // reports false if the server closed the connection (restart, idle timeout) or the state is not idle.
    bool check_alive();
    int backend_pid() const noexcept;
    clock::time_point last_used() const noexcept { return last_used_; }
    const connection_options& options() const noexcept { return opts_; }
    const logger& log() const noexcept { return log_; }

  private:
    struct op;  // one operation's deadline and cancel state
    struct io_ready;
    enum class want { read, write, read_or_write };
    struct attempt;
    struct stmt_plan {
        std::string name;  // empty: unnamed statement
        std::string key;   // cache key when `prepare` is set
        bool prepare = false;
    };

    connection(asio::any_io_executor ex, asio::any_io_executor offload, connection_options opts, logger log,
               std::shared_ptr<stats> st);

    static net::awaitable<result<std::vector<attempt>>> plan_attempts(const config& cfg);
    net::awaitable<result<void>> start(const config& cfg, const attempt& a);
    net::awaitable<io_ready> wait_io(want w, clock::time_point deadline);
    net::awaitable<std::error_code> flush(op& o);
    net::awaitable<result<pg_result*>> next_result(op& o);
    net::awaitable<result<rows>> collect(op& o);
    net::awaitable<result<std::vector<result<rows>>>> collect_pipeline(op& o, const pipeline& batch,
                                                                       const std::vector<stmt_plan>& plans);
    net::awaitable<result<void>> read_prepare(op& o, const stmt_plan& plan);
    net::awaitable<result<void>> expect_sync(op& o);

    stmt_plan plan_statement(const std::string& sql, const params& p);
    bool send_statement(const std::string& sql, const params& p, const stmt_plan& plan);
    result<void> begin_op();
    void end_op(clock::time_point began, const std::error_code& ec, const op& o);
    void reassign_socket();
    void send_cancel();
    void abort_socket() noexcept;
    error lost(std::string_view what);
    error result_error(const pg_result* r, const op& o);
    error fail_op(std::error_code ec, const op& o);
    error unconfirmed_commit() const;
    std::string conn_message() const;
    static void on_notice(void* self, const pg_result* res);

    pg_conn* conn_ = nullptr;
    asio::any_io_executor offload_;
    net::nothrow_t::as_default_on_t<asio::posix::stream_descriptor> sd_;
    net::steady_timer timer_;
    connection_options opts_;
    logger log_;
    std::shared_ptr<stats> stats_;
    std::unordered_map<std::string, std::string> prepared_;  // cache key → statement name
    std::size_t next_statement_ = 0;
    bool broken_ = false;
    bool busy_ = false;
    // The server cancelled this operation's wait for its synchronous standby (a cancel request, ours after a
    // deadline or anyone's): it committed locally and answered success, but a failover may lose the commit.
    bool commit_unconfirmed_ = false;
    clock::time_point last_used_ = clock::now();
};

}  // namespace cg::pg
