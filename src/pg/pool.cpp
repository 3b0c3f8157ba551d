#include "pg/pool.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <mutex>

#include "net/backoff.hpp"
#include "net/boxed.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "pg/rows.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using std::chrono::milliseconds;

std::chrono::milliseconds next_backoff(milliseconds current, milliseconds initial,
                                       milliseconds max) noexcept {
    if (current <= milliseconds::zero()) return std::min(initial, max);
    return net::exponential_delay(current, 1, max);
}

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

// ---- readiness: written on the pool's executor, read by health checks from anywhere
// ------------------------

struct pool::readiness {
    mutable std::mutex mu;
    bool up = false;
    std::string detail = "not connected yet";

    void set(bool u, std::string d) {
        std::lock_guard lock(mu);
        up = u;
        detail = std::move(d);
    }
    metrics::check_status get() const {
        std::lock_guard lock(mu);
        return {up, detail};
    }
};

// A caller waiting for a connection to come back. Lives in the acquire() coroutine frame.
struct pool::waiter {
    net::steady_timer timer;
    std::unique_ptr<connection> conn;  // handed over directly by give_back
    pool* owner;

    waiter(asio::any_io_executor ex, clock::time_point deadline, pool* p) : timer(ex, deadline), owner(p) {}
    ~waiter() {
        std::erase(owner->waiters_, this);
        if (conn) owner->drop(std::move(conn));  // handed over, but the caller went away
    }
};

// ---- pooled_connection
// ---------------------------------------------------------------------------------------

pooled_connection::pooled_connection(std::shared_ptr<pool> p, std::unique_ptr<connection> c) noexcept
    : pool_(std::move(p)), conn_(std::move(c)) {}

pooled_connection& pooled_connection::operator=(pooled_connection&& o) noexcept {
    if (this != &o) {
        release();
        pool_ = std::move(o.pool_);
        conn_ = std::move(o.conn_);
    }
    return *this;
}

void pooled_connection::release() noexcept {
    if (pool_ && conn_) pool_->give_back(std::move(conn_));
    pool_.reset();
}

void pooled_connection::discard() noexcept {
    if (pool_ && conn_) {
        --pool_->in_use_;
        pool_->drop(std::move(conn_));
    }
    pool_.reset();
}

// ---- pool ------------------------------------------------------------------------------------------------

std::shared_ptr<pool> pool::create(asio::any_io_executor ex, asio::any_io_executor offload, pool_options opts,
                                   logger log, metrics::registry* reg) {
    return std::shared_ptr<pool>(
        new pool(std::move(ex), std::move(offload), std::move(opts), std::move(log), reg));
}

pool::pool(asio::any_io_executor ex, asio::any_io_executor offload, pool_options opts, logger log,
           metrics::registry* reg)
    : ex_(std::move(ex)),
      offload_(std::move(offload)),
      opts_(std::move(opts)),
      log_(log.with({{"component", "pg.pool"}, {"pool", opts_.name}})),
      ready_(std::make_shared<readiness>()),
      rng_(static_cast<unsigned>(clock::now().time_since_epoch().count())) {
    if (opts_.size == 0) opts_.size = 1;
    if (reg) stats_ = std::make_shared<stats>(*reg, opts_.name, opts_.size);
}

pool::~pool() = default;

void pool::add_readiness_check(metrics::health& h, std::string name) {
    h.add_readiness(std::move(name), [r = ready_] { return r->get(); });
}

pool::status pool::state() const {
    status s;
    s.size = opts_.size;
    s.open = open_;
    s.idle = idle_.size();
    s.in_use = in_use_;
    s.waiting = waiters_.size();
    s.up = !down_ && ready_->get().ok;
    s.last_error = last_error_ ? last_error_.describe() : std::string();
    return s;
}

net::awaitable<result<pooled_connection>> pool::acquire(acquire_mode mode) {
    auto wait = mode == acquire_mode::fail_fast ? opts_.acquire_timeout : opts_.server_wait;
    return acquire_until(mode, clock::now() + wait);
}

net::awaitable<result<pooled_connection>> pool::acquire_until(acquire_mode mode, clock::time_point deadline) {
    auto self = shared_from_this();
    const bool on_demand = mode == acquire_mode::wait_for_server;
    const auto began = clock::now();
    auto fail = [this](std::string why) -> result<pooled_connection> {
        if (stats_) stats_->acquire_failures.Increment();
        return error(errc::unavailable, std::move(why));
    };
    auto waited = [&] {
        return std::to_string(std::chrono::duration_cast<milliseconds>(clock::now() - began).count()) + " ms";
    };
    error last_connect;
    for (;;) {
        if (closed_) co_return fail("the pool is closed");
        if (auto c = take_idle()) {
            ++in_use_;
            update_gauges();
            co_return pooled_connection(self, std::move(c));
        }
        clock::time_point wake = deadline;  // or a short pause before the next on-demand connect
        if (open_ < opts_.size && on_demand && clock::now() < demand_retry_at_) {
            wake = std::min(deadline, demand_retry_at_);  // an on-demand connect just failed: pause first
        } else if (open_ < opts_.size) {
            if (!on_demand && !may_connect()) co_return fail(down_message());
            auto r = co_await open_one(on_demand ? deadline : clock::time_point::max());
            if (r) {
                ++in_use_;
                update_gauges();
                co_return pooled_connection(self, std::move(*r));
            }
            if (!on_demand) co_return fail(r.err().describe());
            last_connect = r.err();
            if (clock::now() >= deadline)
                co_return fail("no working PostgreSQL connection within " + waited() + ": " +
                               last_connect.describe());
            // Short and independent of the background backoff (which may say "seconds"): the caller's
            // deadline, not a timer, bounds how long it keeps trying.
            if (r.err().code != errc::canceled)
                demand_retry_at_ =
                    clock::now() + std::clamp(opts_.backoff_initial, milliseconds(10), milliseconds(250));
            wake = std::min(deadline, std::max(demand_retry_at_, clock::now() + milliseconds(10)));
        } else if (waiters_.size() >= opts_.max_waiters) {
            co_return fail("too many callers waiting for a connection (" + std::to_string(waiters_.size()) +
                           ")");
        }
        // Wait for a connection to come back (every one is loaned out), or for the pause: boundedly.
        if (stats_) stats_->waits.Increment();
        waiter w(ex_, wake, this);
        waiters_.push_back(&w);
        co_await w.timer.async_wait();
        std::erase(waiters_, &w);
        if (w.conn) {
            ++in_use_;
            update_gauges();
            co_return pooled_connection(self, std::move(w.conn));
        }
        if (clock::now() >= deadline) {
            if (last_connect)
                co_return fail("no working PostgreSQL connection within " + waited() + ": " +
                               last_connect.describe());
            co_return fail("no connection came free within " + waited() + " (all " +
                           std::to_string(opts_.size) + " in use)");
        }
        // Woken because a slot was freed (a connection dropped), the pause ended or the pool closed: again.
    }
}

std::unique_ptr<connection> pool::take_idle() {
    while (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        if (c->check_alive()) return c;
        log_.info("dropping a dead idle connection");
        drop(std::move(c));
    }
    return nullptr;
}

net::awaitable<result<std::unique_ptr<connection>>> pool::open_one(clock::time_point deadline) {
    ++open_;
    if (down_) probing_ = true;
    update_gauges();
    result<std::unique_ptr<connection>> r =
        error(errc::canceled, "connect abandoned at the caller's deadline");
    if (deadline == clock::time_point::max()) {
        r = co_await connection::connect(opts_.server, offload_, opts_.conn, log_, stats_);
    } else {
        // An on-demand connect ends at the caller's deadline (the connect is cancelled: canceled is not a
        // verdict on the server, so it does not mark the pool down).
        auto left = std::max<clock::duration>(deadline - clock::now(), clock::duration::zero());
        auto done = co_await net::with_timeout(
            net::boxed(connection::connect(opts_.server, offload_, opts_.conn, log_, stats_)), left);
        if (done) r = std::move(**done);
    }
    probing_ = false;
    if (!r) {
        --open_;
        update_gauges();
        if (r.err().code != errc::canceled) mark_down(r.err());
        if (stats_) stats_->error(r.err().code);
        wake_one_for_slot();
        co_return r.err();
    }
    mark_up();
    if (opts_.watch_failover) co_await note_identity(**r);
    co_return std::move(*r);
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
        identity_ = std::move(now);
        co_return;
    }
    auto cause = failover_cause(*identity_, now);
    if (now.in_recovery) co_return;  // a standby: not where commits go, and not what later ones compare with
    if (cause.empty()) {
        identity_ = std::move(now);
        co_return;
    }
    failover_event ev{*identity_, now, std::move(cause)};
    identity_ = std::move(now);
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

void pool::give_back(std::unique_ptr<connection> c) noexcept {
    --in_use_;
    if (closed_ || c->broken()) return drop(std::move(c));
    switch (c->transaction_status()) {
        case tx_status::idle:
            if (c->check_alive()) return to_idle(std::move(c));
            return drop(std::move(c));
        case tx_status::in_transaction:
        case tx_status::in_error:
            // Never hand a half-done transaction to the next caller.
            asio::co_spawn(ex_, rollback_and_return(shared_from_this(), std::move(c)),
                           [log = log_](std::exception_ptr e) {
                               if (e)
                                   log.error("rolling back a returned connection failed",
                                             {{"error", describe_exception(e)}});
                           });
            return;
        default:
            return drop(std::move(c));
    }
}

net::awaitable<void> pool::rollback_and_return(std::shared_ptr<pool> self, std::unique_ptr<connection> c) {
    auto r = co_await c->execute("ROLLBACK");
    if (r && c->transaction_status() == tx_status::idle) {
        self->log_.warn("a connection came back inside a transaction: rolled back");
        self->to_idle(std::move(c));
    } else {
        self->log_.warn("a connection came back inside a transaction and could not be rolled back: dropped");
        self->drop(std::move(c));
    }
}

void pool::drop(std::unique_ptr<connection> c) noexcept {
    c.reset();  // PQfinish on the offload pool
    --open_;
    update_gauges();
    wake_one_for_slot();
}

void pool::to_idle(std::unique_ptr<connection> c) {
    if (closed_) return drop(std::move(c));
    if (!waiters_.empty()) {
        waiter* w = waiters_.front();
        waiters_.pop_front();
        w->conn = std::move(c);
        w->timer.cancel();
    } else {
        idle_.push_back(std::move(c));
    }
    update_gauges();
}

void pool::wake_one_for_slot() {
    if (waiters_.empty()) return;
    waiter* w = waiters_.front();
    waiters_.pop_front();
    w->timer.cancel();
}

bool pool::may_connect() const {
    return !down_ || (!probing_ && clock::now() >= next_attempt_);
}

std::string pool::down_message() const {
    auto left = std::chrono::duration_cast<milliseconds>(next_attempt_ - clock::now()).count();
    return "PostgreSQL is unreachable (" + last_error_.describe() + "); next connection attempt " +
           (probing_ ? std::string("in progress")
                     : "in " + std::to_string(std::max<long long>(left, 0)) + " ms");
}

void pool::mark_up() {
    if (down_) log_.info("PostgreSQL reachable again", {{"server", opts_.server.describe()}});
    down_ = false;
    backoff_ = milliseconds::zero();
    last_error_ = {};
    ready_->set(true, "connected to " + opts_.server.describe());
    if (stats_) stats_->up.Set(1);
}

void pool::mark_down(const error& e) {
    backoff_ = next_backoff(backoff_, opts_.backoff_initial, opts_.backoff_max);
    // ±20 % jitter so a fleet of sidecars does not reconnect in lockstep.
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    next_attempt_ = clock::now() + net::apply_jitter(backoff_, net::jitter::spread_20, unit);
    if (!down_)
        log_.warn("PostgreSQL unreachable", {{"error", e.describe()}, {"retry_ms", backoff_.count()}});
    down_ = true;
    last_error_ = e;
    ready_->set(false, e.describe());
    if (stats_) stats_->up.Set(0);
}

void pool::update_gauges() {
    if (!stats_) return;
    stats_->open.Set(static_cast<double>(open_));
    stats_->in_use.Set(static_cast<double>(in_use_));
}

net::awaitable<void> pool::close() {
    closed_ = true;
    if (maint_timer_) maint_timer_->cancel();
    while (!waiters_.empty()) wake_one_for_slot();
    while (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        drop(std::move(c));
    }
    ready_->set(false, "the pool is closed");
    co_return;
}

// ---- maintenance ------------------------------------------------------------------------------------------

struct pool::maintainer {
    static net::awaitable<void> run(std::shared_ptr<pool> self) {
        while (!self->closed_) {
            if (self->open_ == 0 || self->down_) {
                // Warm-up and reconnect probes, so readiness tracks the server without traffic.
                if (self->may_connect() && self->open_ < self->opts_.size) {
                    auto r = co_await self->open_one();
                    if (r) self->to_idle(std::move(*r));
                }
            } else if (!self->idle_.empty() &&
                       clock::now() - self->idle_.front()->last_used() >= self->opts_.health_interval) {
                auto c = std::move(self->idle_.front());
                self->idle_.pop_front();
                co_await ping(self, std::move(c));
                continue;  // the next stale connection, if any, right away
            }
            if (self->closed_) break;
            auto wait = self->down_
                            ? std::chrono::duration_cast<milliseconds>(self->next_attempt_ - clock::now())
                            : self->opts_.health_interval / 2;
            self->maint_timer_->expires_after(std::max(wait, milliseconds(10)));
            co_await self->maint_timer_->async_wait();
        }
    }
};

net::awaitable<void> pool::ping(std::shared_ptr<pool> self, std::unique_ptr<connection> c) {
    auto timeout = std::min<milliseconds>(self->opts_.conn.query_timeout, milliseconds(2000));
    if (timeout <= milliseconds::zero()) timeout = milliseconds(2000);
    auto r = co_await c->query_with("SELECT 1", params(), timeout);
    if (r) {
        self->mark_up();
        self->to_idle(std::move(c));
        co_return;
    }
    self->log_.info("an idle connection failed its health check", {{"error", r.err().describe()}});
    self->drop(std::move(c));
    // Is it the connection or the server? A fresh connect tells, and marks the pool down if needed.
    if (!self->closed_ && self->may_connect() && self->open_ < self->opts_.size) {
        auto fresh = co_await self->open_one();
        if (fresh) self->to_idle(std::move(*fresh));
    }
}

void pool::start() {
    if (started_) return;
    started_ = true;
    maint_timer_ = std::make_unique<net::steady_timer>(ex_);
    asio::co_spawn(ex_, maintainer::run(shared_from_this()), [log = log_](std::exception_ptr e) {
        if (!e) return;
        log.error("pool maintenance task failed", {{"error", describe_exception(e)}});
    });
}

net::awaitable<result<rows>> exec_pooled(std::shared_ptr<pool> pool, const std::string& sql, params p,
                                         acquire_mode mode) {
    auto c = co_await pool->acquire(mode);
    if (!c) co_return c.err();
    auto& conn = **c;
    co_return co_await conn.query_with(sql, std::move(p), conn.options().query_timeout);
}

}  // namespace cg::pg
