// Event-loop lag probe: a timer on the loop it watches that measures its own lateness.
// If anything blocks the loop, the next tick fires late by about as long as the block lasted.
#pragma once

#include <asio/any_io_executor.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>

namespace cg::net {

class lag_probe : public std::enable_shared_from_this<lag_probe> {
  public:
    using clock = std::chrono::steady_clock;
    // `record` is called on the probed executor with each measured lateness in seconds.
    lag_probe(asio::any_io_executor ex, clock::duration interval, std::function<void(double)> record);

    // Starts ticking (co_spawned on the executor). Stop with stop(); the probe keeps itself alive while
    // running.
    void start();
    void stop();

    // Largest lateness seen within `window` (ending now), counting a tick that is overdue right now.
    // Thread-safe: health handlers may ask from anywhere.
    double recent_max_lag(clock::duration window) const;

  private:
    friend struct lag_probe_runner;
    void on_tick(clock::time_point due, clock::time_point fired);

    asio::any_io_executor ex_;
    clock::duration interval_;
    std::function<void(double)> record_;
    std::atomic<bool> stopped_{false};
    // Slots of per-second maxima over the last 64 s (ring buffer), plus the next due time.
    static constexpr int slots = 64;
    std::atomic<std::int64_t> slot_second_[slots];
    std::atomic<double> slot_max_[slots];
    std::atomic<clock::rep> next_due_{0};
};

}  // namespace cg::net
