#include "net/stoppable_task.hpp"

#include <asio/co_spawn.hpp>
#include <exception>

#include "core/error.hpp"
#include "metrics/registry.hpp"

namespace cg::net {

void stoppable_task::start(asio::any_io_executor ex, std::shared_ptr<void> owner, awaitable<void> loop,
                           logger log, std::string what) {
    timer_ = std::make_unique<steady_timer>(ex);
    done_ = std::make_unique<steady_timer>(ex, std::chrono::steady_clock::time_point::max());
    log_ = std::move(log);
    what_ = std::move(what);
    running_ = true;
    asio::co_spawn(ex, run(this, owner, std::move(loop)), [this, owner](std::exception_ptr e) {
        if (!e) return;
        log_.error(what_ + " stopped", {{"error", describe_exception(e)}});
        ended();
    });
}

awaitable<void> stoppable_task::run(stoppable_task* self, std::shared_ptr<void> owner, awaitable<void> loop) {
    co_await std::move(loop);
    self->ended();
    (void)owner;  // held until here: the loop's end is signalled while this task still exists
}

void stoppable_task::start_job(asio::any_io_executor ex, std::shared_ptr<void> owner, job_spec spec,
                               std::function<awaitable<bool>()> pass, logger log) {
    log.info(spec.name + " started",
             {{"job", spec.name}, {"interval_ms", static_cast<std::int64_t>(spec.interval.count())}});
    auto name = spec.name;
    auto loop = job_loop(this, std::move(spec), std::move(pass));
    start(std::move(ex), std::move(owner), std::move(loop), std::move(log), std::move(name));
}

awaitable<void> stoppable_task::job_loop(stoppable_task* self, job_spec spec,
                                         std::function<awaitable<bool>()> pass) {
    metrics::Counter* passes = nullptr;
    metrics::Counter* failures = nullptr;
    if (spec.metrics) {
        passes = &spec.metrics
                      ->counter("chargeguard_background_job_passes_total",
                                "Passes run by each background job (sweeper, poller, backfill, ...)")
                      .Add({{"job", spec.name}});
        failures = &spec.metrics
                        ->counter("chargeguard_background_job_failures_total",
                                  "Passes of a background job that ended in an exception (the job goes on)")
                        .Add({{"job", spec.name}});
    }
    // Named waits only in the co_await expressions: g++ 12 evaluates both arms of a conditional operator
    // there (an empty next_wait would be called).
    std::chrono::steady_clock::duration wait = spec.interval;
    if (spec.first_after.count() >= 0) wait = spec.first_after;
    co_await self->sleep(wait);
    while (!self->stopping()) {
        bool more = true;
        try {
            more = co_await pass();
        } catch (...) {
            if (failures) failures->Increment();
            self->log_.error(spec.name + " pass failed; trying again at the next interval",
                             {{"job", spec.name}, {"error", describe_exception(std::current_exception())}});
        }
        if (passes) passes->Increment();
        if (!more || self->stopping()) break;
        wait = spec.interval;
        if (spec.next_wait) wait = spec.next_wait();
        co_await self->sleep(wait);
    }
    self->log_.info(spec.name + " stopped", {{"job", spec.name}});
}

void stoppable_task::ended() noexcept {
    running_ = false;
    if (done_) done_->cancel();
}

awaitable<void> stoppable_task::sleep(std::chrono::steady_clock::duration d) {
    if (stopping_ || !timer_) co_return;
    timer_->expires_after(d);
    co_await timer_->async_wait();
}

void stoppable_task::wake() noexcept {
    if (timer_) timer_->cancel();
}

void stoppable_task::request_stop() noexcept {
    stopping_ = true;
    if (timer_) timer_->cancel();
}

awaitable<void> stoppable_task::stop() {
    request_stop();
    if (running_ && done_) co_await done_->async_wait();
}

}  // namespace cg::net
