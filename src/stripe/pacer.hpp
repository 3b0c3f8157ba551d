// Drives a rate_control for one stripe::client: callers wait their turn, first come first served, without
// blocking any thread — a waiter parks on a timer that the dispatcher cancels when a token is there.
//
// Executors: every member runs on the executor given to create() (the client's strand); the dispatcher
// coroutine runs there too and exists only while someone waits. It holds the pacer alive while it runs.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <deque>
#include <memory>

#include "net/tokens.hpp"
#include "stripe/rate_control.hpp"

namespace cg::stripe {

class pacer : public std::enable_shared_from_this<pacer> {
  public:
    static std::shared_ptr<pacer> create(asio::any_io_executor ex, rate_config cfg);

    // Completes when one request may be sent (at once when a token is there and nobody queues). Returns how
    // long the caller waited. Not cancellable: a waiter is released in turn.
    net::awaitable<std::chrono::steady_clock::duration> acquire();
    // An answer arrived (`throttled`: HTTP 429) to a request admitted at `sent_at`.
    void on_response(bool throttled, std::chrono::steady_clock::time_point sent_at = {});

    double limit() const noexcept { return rc_.limit(); }
    // Shared pacing (rate_control.hpp): what this pacer tells its peers (resets `pressed`), and one
    // exchange's view of the peers (empty: none, pace alone).
    pacer_report take_report();
    void apply_peers(const peer_view* peers, std::size_t n, std::size_t self);
    std::size_t waiting() const noexcept { return waiting_.size(); }

  private:
    pacer(asio::any_io_executor ex, rate_config cfg);
    static net::awaitable<void> dispatch(std::shared_ptr<pacer> self);

    asio::any_io_executor ex_;
    rate_control rc_;
    std::deque<net::steady_timer*> waiting_;
    bool dispatching_ = false;
};

}  // namespace cg::stripe
