// One background loop that can be stopped and awaited: whether a stop was asked, the loop's sleep (a stop
// ends it at once), and the signal the loop's end gives to stop(). The periodic jobs of `consume` (the
// pending-age monitor, the sweeper, the backfill) each hold one. Every member runs on the executor given to
// start().
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/log.hpp"
#include "net/tokens.hpp"

namespace cg::net {

class stoppable_task {
  public:
    // Runs `loop` on `ex`; `owner` keeps what the loop refers to (this task included) alive until it has
    // ended. The loop should return soon after stopping() turns true; an exception out of it is logged as
    // "`what` stopped" and ends the task as a return would.
    void start(asio::any_io_executor ex, std::shared_ptr<void> owner, awaitable<void> loop, logger log,
               std::string what);
    bool stopping() const noexcept { return stopping_; }
    // Sleeps `d` unless stopped; a stop ends the sleep early (stopping() then says so).
    awaitable<void> sleep(std::chrono::steady_clock::duration d);
    // Ends a sleep in progress early without stopping (the loop decides what its early wake means).
    void wake() noexcept;
    // Asks the loop to stop and wakes its sleep, without waiting (for destructors).
    void request_stop() noexcept;
    // Asks, then waits until the loop has ended (at once if it never started or already ended).
    awaitable<void> stop();

  private:
    static awaitable<void> run(stoppable_task* self, std::shared_ptr<void> owner, awaitable<void> loop);
    void ended() noexcept;

    std::unique_ptr<steady_timer> timer_;
    std::unique_ptr<steady_timer> done_;  // cancelled when the loop has ended
    bool stopping_ = false;
    bool running_ = false;
    logger log_;
    std::string what_;
};

}  // namespace cg::net
