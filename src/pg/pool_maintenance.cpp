// The pool's maintenance task (pool.hpp): warm-up and reconnect probes while the pool is down, health checks
// of idle connections, and the failover record's comparison when a connect could not make it.
#include <asio/co_spawn.hpp>

#include "pg/pool.hpp"

namespace cg::pg {

using std::chrono::milliseconds;

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
            } else if (self->record_due() && !self->idle_.empty()) {
                // The record could not be compared at connect (e.g. before the migrations created it).
                auto c = std::move(self->idle_.back());
                self->idle_.pop_back();
                auto now = *self->identity_;
                co_await self->record_identity(*c, now, false);
                if (c->broken())
                    self->drop(std::move(c));
                else
                    self->to_idle(std::move(c));
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

}  // namespace cg::pg
