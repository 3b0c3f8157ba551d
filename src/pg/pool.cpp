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

net::awaitable<result<rows>> exec_pooled(std::shared_ptr<pool> pool, const std::string& sql, params p,
                                         acquire_mode mode) {
    auto c = co_await pool->acquire(mode);
    if (!c) co_return c.err();
    auto& conn = **c;
    co_return co_await conn.query_with(sql, std::move(p), conn.options().query_timeout);
}

}  // namespace cg::pg
