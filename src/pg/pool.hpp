// A fixed-size pool of PostgreSQL connections on one executor (the main io_context).
//
//  * lazy: connections open on demand up to `size` (plus one opened by start() so readiness is known early);
//  * health: an idle connection is checked without I/O when handed out (did the server close it?), and
//    the maintenance task pings connections idle longer than `health_interval`;
//  * failure: when a connect fails the pool is "down": acquire() fails at once with errc::unavailable and
//    the cause, until the backoff (doubling from backoff_initial to backoff_max, jittered) lets one probe
//    through; the maintenance task probes on its own so readiness recovers without traffic. A caller that
//    must not give up on a stale "down" (acquire_mode::wait_for_server, e.g. recording a charge Stripe
//    already made) ignores the backoff: it connects at once, on demand, and keeps trying until its deadline;
//  * bounded: when every connection is busy, acquire() waits at most `acquire_timeout`, and at most
//    `max_waiters` callers wait; beyond either it returns errc::unavailable;
//  * a connection given back inside a transaction is rolled back before reuse (dropped if that fails); one
//    given back broken or mid-operation is dropped;
//  * failover (pool_options::watch_failover): every new connection reads the identity of the server it
//    reached (server_identity); one that differs from the last seen in a way only another server explains
//    (failover_cause) is a failover: counted, logged, and told to the listeners (on_failover). A failover
//    with asynchronous replication may have lost the last commits, which only a sweep of the ledger heals.
//    With pool_options::failover_record the last server seen is also kept in the database and compared at
//    start and on each reconnect, so a pool started after a failover sees it as well (record_identity).
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "net/tokens.hpp"
#include "pg/config.hpp"
#include "pg/connection.hpp"

namespace cg::pg {

class stats;
class pool;

struct pool_options {
    config server;
    std::size_t size = 4;
    connection_options conn;
    std::chrono::milliseconds acquire_timeout{1000};
    // How long acquire(acquire_mode::wait_for_server) waits for a working connection at most.
    std::chrono::milliseconds server_wait{5000};
    std::size_t max_waiters = 256;
    std::chrono::milliseconds health_interval{10000};
    std::chrono::milliseconds backoff_initial{100};
    std::chrono::milliseconds backoff_max{5000};
    std::string name = "main";  // metrics label
    // Read each new connection's server identity and report a change of server (on_failover). One more
    // statement per connect; consume sets it (its sweeper heals what a failover lost).
    bool watch_failover = false;
    // With watch_failover: the name under which the server last seen as the primary is kept in the database
    // (pg_server_seen, migration 0024). A new primary connection is also compared with that record, so a
    // pool started only after a failover, which never saw the server before it, reports it too; then the
    // server it reached is recorded. Empty: compared in memory only. consume names it by its key namespace.
    std::string failover_record;
};

// The server a connection reached, as it describes itself.
struct server_identity {
    // pg_control_system(): the cluster's identifier — the same on a physical standby as on its primary, so a
    // promotion keeps it; a different one is another cluster altogether.
    std::string system_identifier;
    // The WAL timeline a primary writes on (from its current WAL file name): a promotion starts a new one.
    // 0 on a standby (in recovery), which is not written to.
    std::int64_t timeline = 0;
    bool in_recovery = false;  // pg_is_in_recovery(): a standby
    std::string address;       // inet_server_addr():inet_server_port() ("local" over a Unix socket)
};

// Why a connection that reached `now` after one reached `before` is on a server that may not hold every
// commit the earlier one acknowledged: another cluster, a primary on another timeline (a promotion), a
// standby that became a primary, or another address. Empty when nothing says so, and when `now` is a standby
// (not where commits go). Pure; table-tested.
std::string failover_cause(const server_identity& before, const server_identity& now);

struct failover_event {
    server_identity before, now;
    std::string cause;  // failover_cause
};

// What acquire() does while the pool believes PostgreSQL is down (a connect failed, reconnect backoff).
enum class acquire_mode {
    // Fail at once with errc::unavailable and the cause; wait at most acquire_timeout for a busy pool.
    fail_fast,
    // The backoff timer is not a verdict: connect now, on demand (bounded by the deadline), and again after
    // short pauses until a connection works or the deadline passes (server_wait unless given explicitly).
    // Concurrent connects stay bounded by the pool size. A busy pool is waited for until the deadline too.
    wait_for_server,
};

// The next reconnect delay: doubles from `initial`, capped at `max` (before jitter). Pure.
std::chrono::milliseconds next_backoff(std::chrono::milliseconds current, std::chrono::milliseconds initial,
                                       std::chrono::milliseconds max) noexcept;

// A connection on loan. Gives it back to the pool when destroyed (or on release()). Move-only; destroy it on
// the pool's executor.
class pooled_connection {
  public:
    pooled_connection() = default;
    pooled_connection(std::shared_ptr<pool> p, std::unique_ptr<connection> c) noexcept;
    pooled_connection(pooled_connection&&) noexcept = default;
    pooled_connection& operator=(pooled_connection&& o) noexcept;
    ~pooled_connection() { release(); }

    connection& operator*() const noexcept { return *conn_; }
    connection* operator->() const noexcept { return conn_.get(); }
    explicit operator bool() const noexcept { return static_cast<bool>(conn_); }

    // Returns the connection now (rolled back first if a transaction is open).
    void release() noexcept;
    // Closes the connection instead of reusing it (its state is unknown to the caller).
    void discard() noexcept;

  private:
    std::shared_ptr<pool> pool_;
    std::unique_ptr<connection> conn_;
};

class pool : public std::enable_shared_from_this<pool> {
  public:
    using clock = std::chrono::steady_clock;

    // `ex`: where the pool and its connections live (the main io_context). `offload`: for PQfinish;
    // it must outlive the pool. `reg`: metrics (optional; must outlive the pool).
    static std::shared_ptr<pool> create(asio::any_io_executor ex, asio::any_io_executor offload,
                                        pool_options opts, logger log, metrics::registry* reg = nullptr);
    ~pool();

    // Starts the maintenance task (first connection, health pings, reconnect probes). Call once, on `ex`.
    void start();

    // A connection, or errc::unavailable with the reason (fail_fast: PostgreSQL down and the cause, pool
    // exhausted after acquire_timeout; wait_for_server: no working connection by server_wait, with the last
    // connect error; either: too many waiters, pool closed). Completes on the pool's executor; cancellable
    // through the awaiting coroutine's cancellation slot (then errc::unavailable). The pool stays alive while
    // a pooled_connection exists.
    net::awaitable<result<pooled_connection>> acquire(acquire_mode mode = acquire_mode::fail_fast);
    // As acquire(mode), with an explicit deadline instead of acquire_timeout / server_wait.
    net::awaitable<result<pooled_connection>> acquire_until(acquire_mode mode, clock::time_point deadline);

    // Called on the pool's executor, after the connection that saw it was opened, for every failover seen
    // (pool_options::watch_failover). The first connection only sets what later ones are compared with.
    void on_failover(std::function<void(const failover_event&)> f);
    // The identity of the server the last new connection reached (empty before, or without watch_failover).
    const std::optional<server_identity>& server() const noexcept { return identity_; }

    // Registers a readiness check "postgres" that reads the pool's cached view (no query per request).
    void add_readiness_check(metrics::health& h, std::string name = "postgres");

    // Stops the maintenance task, fails waiters, closes idle connections; loaned connections close when given
    // back. Completes on the pool's executor.
    net::awaitable<void> close();

    struct status {
        std::size_t size = 0, open = 0, idle = 0, in_use = 0, waiting = 0;
        bool up = false;
        std::string last_error;
    };
    status state() const;
    const pool_options& options() const noexcept { return opts_; }

  private:
    friend class pooled_connection;
    struct waiter;
    struct readiness;
    struct maintainer;

    pool(asio::any_io_executor ex, asio::any_io_executor offload, pool_options opts, logger log,
         metrics::registry* reg);

    std::unique_ptr<connection> take_idle();
    net::awaitable<result<std::unique_ptr<connection>>> open_one(
        clock::time_point deadline = clock::time_point::max());
    void give_back(std::unique_ptr<connection> c) noexcept;
    void drop(std::unique_ptr<connection> c) noexcept;
    void to_idle(std::unique_ptr<connection> c);
    void wake_one_for_slot();
    void mark_up();
    void mark_down(const error& e);
    bool may_connect() const;
    std::string down_message() const;
    void update_gauges();
    net::awaitable<void> note_identity(connection& c);
    // Compares `now` (a primary) with the database's record (failover_record) and records it; reports a
    // failover when the record names another server and `seen` (one already reported in memory) is false.
    // A failed statement (the table not there yet before the migrations) leaves it to the next connect or
    // the maintenance task.
    net::awaitable<void> record_identity(connection& c, const server_identity& now, bool seen);
    bool record_due() const noexcept;
    void report_failover(failover_event ev);
    static net::awaitable<void> rollback_and_return(std::shared_ptr<pool> self,
                                                    std::unique_ptr<connection> c);
    static net::awaitable<void> ping(std::shared_ptr<pool> self, std::unique_ptr<connection> c);

    asio::any_io_executor ex_;
    asio::any_io_executor offload_;
    pool_options opts_;
    logger log_;
    std::shared_ptr<stats> stats_;
    std::shared_ptr<readiness> ready_;

    std::deque<std::unique_ptr<connection>> idle_;  // back = most recently used
    std::deque<waiter*> waiters_;
    std::size_t open_ = 0;    // idle + loaned + connecting + rolling back
    std::size_t in_use_ = 0;  // loaned
    bool closed_ = false;
    bool started_ = false;

    bool down_ = false;     // the last connect failed
    bool probing_ = false;  // a connect is in progress while down
    clock::time_point next_attempt_{};
    std::chrono::milliseconds backoff_{0};
    error last_error_;
    // wait_for_server callers: no on-demand connect before this (set after one failed), so however many
    // callers wait, a server that refuses at once sees at most `size` attempts per short pause.
    clock::time_point demand_retry_at_{};
    std::minstd_rand rng_;
    std::unique_ptr<net::steady_timer> maint_timer_;
    std::optional<server_identity> identity_;
    // The identity the database's record was last found equal to, or set to (failover_record).
    std::optional<server_identity> recorded_;
    bool failed_over_in_memory_ = false;  // a failover was seen between two of this pool's connections
    bool recording_ = false;              // a record_identity in progress
    std::vector<std::function<void(const failover_event&)>> failover_listeners_;
};

// One statement on a connection from `pool` (acquired with `mode`), under the connection's query timeout;
// the connection goes back when it completes. `sql` must outlive the call (the callers pass statics).
net::awaitable<result<rows>> exec_pooled(std::shared_ptr<pool> pool, const std::string& sql, params p,
                                         acquire_mode mode = acquire_mode::fail_fast);

}  // namespace cg::pg
