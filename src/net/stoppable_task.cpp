#include "net/stoppable_task.hpp"

#include <asio/co_spawn.hpp>
#include <exception>

#include "core/error.hpp"

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
