// One background loop that can be stopped and awaited: whether a stop was asked, the loop's sleep (a stop
// ends it at once), and the signal the loop's end gives to stop(). Every background job of a process (the
// sweeper, the settlement poller, the backfill, the pending-age monitor, the shared Stripe pacing, the NSQ
// channel depth, the replication check) holds one and is started the same way, by start_job: a name, an
// interval, a pass run at each one, the stop, its metrics and its logs. Every member runs on the executor
// given to start().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/log.hpp"
#include "net/tokens.hpp"

namespace cg::metrics {
class registry;
}

namespace cg::net {

// How a background job runs (stoppable_task::start_job).
struct job_spec {
    // Names it in the logs ("<name> started", "<name> stopped") and in the metrics' `job` label.
    std::string name;
    // Between the end of one pass and the start of the next.
    std::chrono::milliseconds interval{1000};
    // Before the first pass; negative: one interval.
    std::chrono::milliseconds first_after{-1};
    // When set, the wait before each next pass instead of `interval` (a job that hurries at times).
    std::function<std::chrono::steady_clock::duration()> next_wait;
    // When given: chargeguard_background_job_passes_total{job} counts the passes run and
    // chargeguard_background_job_failures_total{job} those that threw (the job goes on at its next pass).
    metrics::registry* metrics = nullptr;
};

class stoppable_task {
  public:
    // Runs `loop` on `ex`; `owner` keeps what the loop refers to (this task included) alive until it has
    // ended. The loop should return soon after stopping() turns true; an exception out of it is logged as
    // "`what` stopped" and ends the task as a return would.
    void start(asio::any_io_executor ex, std::shared_ptr<void> owner, awaitable<void> loop, logger log,
               std::string what);
    // The one way a background job starts: `pass` after spec.first_after, then again after each interval
    // (or spec.next_wait()) until stop() is asked or a pass returns false (the job is done). A pass that
    // throws is logged and counted, and the job goes on. `owner` as for start().
    void start_job(asio::any_io_executor ex, std::shared_ptr<void> owner, job_spec spec,
                   std::function<awaitable<bool>()> pass, logger log);
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
    static awaitable<void> job_loop(stoppable_task* self, job_spec spec,
                                    std::function<awaitable<bool>()> pass);
    void ended() noexcept;

    std::unique_ptr<steady_timer> timer_;
    std::unique_ptr<steady_timer> done_;  // cancelled when the loop has ended
    bool stopping_ = false;
    bool running_ = false;
    logger log_;
    std::string what_;
};

}  // namespace cg::net
