#include "billing/flow/lease_keeper.hpp"

#include <asio/co_spawn.hpp>

#include "core/error.hpp"

namespace cg::billing {

lease_keeper::lease_keeper(const asio::any_io_executor& ex, std::chrono::milliseconds interval,
                           renew_fn renew, logger log)
    : timer_(ex),
      joined_(ex, std::chrono::steady_clock::time_point::max()),
      interval_(interval),
      renew_(std::move(renew)),
      log_(std::move(log)) {}

void lease_keeper::start() {
    arm();
}

net::awaitable<void> lease_keeper::stop() {
    done_ = true;
    timer_.cancel();
    // A renewal under way refers to the caller's frame: it ends before that frame does.
    if (renewing_) co_await joined_.async_wait();
}

// The timer's handler owns the keeper with the caller; once the call has returned (`done_`) it does nothing.
void lease_keeper::arm() {
    timer_.expires_after(interval_);
    timer_.async_wait([self = shared_from_this()](std::error_code ec) {
        if (ec || self->done_) return;
        self->renewing_ = true;
        asio::co_spawn(self->timer_.get_executor(), self->renew_(), [self](std::exception_ptr e) {
            // A broken invariant in the renewal: the call goes on unrenewed at this interval, and is not left
            // waiting.
            if (e) self->log_.error("lease renewal failed unexpectedly", {{"error", describe_exception(e)}});
            self->ended();
        });
    });
}

// The next renewal while the call is awaited; once it has returned, wake it (it waits for this renewal).
void lease_keeper::ended() {
    renewing_ = false;
    if (done_)
        joined_.cancel();
    else
        arm();
}

net::awaitable<std::optional<machine::in::renewed>> renew_once(const lease_renewal& how,
                                                               const machine::renew_command& what,
                                                               const logger& log) {
    if (how.touch) how.touch();
    if (what.note_in_flight) {
        auto noted = co_await how.note_in_flight(what.generation);
        if (!noted) log.warn("cannot note the call in flight", {{"error", noted.err().describe()}});
        co_return std::nullopt;
    }
    auto renewed = co_await how.renew(what.epoch);
    if (!renewed) {
        log.warn("lease renewal failed; retrying at the next interval",
                 {{"error", renewed.err().describe()}});
        co_return std::nullopt;
    }
    if (!*renewed) {
        if (how.lost) how.lost->Increment();
        log.error("lease lost while Stripe was called: another worker may recover this " +
                  std::string(how.row));
    }
    co_return machine::in::renewed{*renewed};
}

}  // namespace cg::billing
