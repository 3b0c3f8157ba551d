#include "stripe/pacer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <exception>
#include <stdexcept>

#include "net/timeout.hpp"

namespace cg::stripe {

std::shared_ptr<pacer> pacer::create(asio::any_io_executor ex, rate_config cfg) {
    return std::shared_ptr<pacer>(new pacer(std::move(ex), cfg));
}

pacer::pacer(asio::any_io_executor ex, rate_config cfg)
    : ex_(std::move(ex)), rc_(cfg, std::chrono::steady_clock::now()) {}

net::awaitable<std::chrono::steady_clock::duration> pacer::acquire() {
    auto start = std::chrono::steady_clock::now();
    if (waiting_.empty() && rc_.try_take(start)) co_return std::chrono::steady_clock::duration::zero();
    net::steady_timer parked(ex_, std::chrono::steady_clock::time_point::max());
    waiting_.push_back(&parked);
    if (!dispatching_) {
        dispatching_ = true;
        asio::co_spawn(ex_, dispatch(shared_from_this()), [](std::exception_ptr e) {
            // The dispatcher only waits on timers; an exception here is a broken invariant.
            if (e) std::rethrow_exception(e);
        });
    }
    // Released (the dispatcher cancels the timer after taking our token) — the only way out.
    for (;;) {
        co_await parked.async_wait();
        if (parked.expiry() != std::chrono::steady_clock::time_point::min()) continue;
        break;
    }
    co_return std::chrono::steady_clock::now() - start;
}

net::awaitable<void> pacer::dispatch(std::shared_ptr<pacer> self) {
    while (!self->waiting_.empty()) {
        auto now = std::chrono::steady_clock::now();
        if (self->rc_.try_take(now)) {
            net::steady_timer* next = self->waiting_.front();
            self->waiting_.pop_front();
            next->expires_at(
                std::chrono::steady_clock::time_point::min());  // marks "released", cancels the wait
            continue;
        }
        co_await net::sleep_for(self->rc_.until_next(now));
    }
    self->dispatching_ = false;
}

pacer_report pacer::take_report() {
    auto now = std::chrono::steady_clock::now();
    bool pressed = rc_.take_pressed() || !waiting_.empty();
    return {{pressed, rc_.own_sent_rate(now)}, rc_.account_limit(), rc_.throttled_episodes()};
}

void pacer::apply_peers(const peer_view* peers, std::size_t n, std::size_t self) {
    stripe::apply_peers(rc_, peers, n, self, std::chrono::steady_clock::now());
}

void pacer::on_response(bool throttled, std::chrono::steady_clock::time_point sent_at) {
    rc_.on_response(std::chrono::steady_clock::now(), throttled, sent_at);
}

}  // namespace cg::stripe
