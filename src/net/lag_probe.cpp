#include "net/lag_probe.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "net/tokens.hpp"

namespace cg::net {

struct lag_probe_runner {
    static asio::awaitable<void> run(std::shared_ptr<lag_probe> self) {
        steady_timer timer(self->ex_);
        auto due = lag_probe::clock::now() + self->interval_;
        while (!self->stopped_.load()) {
            self->next_due_.store(due.time_since_epoch().count());
            timer.expires_at(due);
            auto [ec] = co_await timer.async_wait();
            if (ec || self->stopped_.load()) break;
            auto fired = lag_probe::clock::now();
            self->on_tick(due, fired);
            // Schedule from now: a long block counts once, not as a burst of late ticks.
            due = fired + self->interval_;
        }
        self->next_due_.store(0);
    }
};

lag_probe::lag_probe(asio::any_io_executor ex, clock::duration interval, std::function<void(double)> record)
    : ex_(std::move(ex)), interval_(interval), record_(std::move(record)) {
    for (int i = 0; i < slots; ++i) {
        slot_second_[i].store(-1);
        slot_max_[i].store(0.0);
    }
}

void lag_probe::start() {
    stopped_.store(false);
    // run() cannot throw except on allocation failure; the handler keeps that visible.
    asio::co_spawn(ex_, lag_probe_runner::run(shared_from_this()), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
}

void lag_probe::stop() {
    // The ticking coroutine sees the flag at its next tick (at most one interval later) and ends; the
    // io_context therefore stays busy for up to one interval after stop().
    stopped_.store(true);
}

void lag_probe::on_tick(clock::time_point due, clock::time_point fired) {
    double lag = std::chrono::duration<double>(fired - due).count();
    if (lag < 0) lag = 0;
    if (record_) record_(lag);
    auto sec = std::chrono::duration_cast<std::chrono::seconds>(fired.time_since_epoch()).count();
    auto& s = slot_second_[sec % slots];
    auto& m = slot_max_[sec % slots];
    if (s.load() != sec) {
        m.store(lag);
        s.store(sec);
    } else if (lag > m.load()) {
        m.store(lag);
    }
}

double lag_probe::recent_max_lag(clock::duration window) const {
    auto now = clock::now();
    double worst = 0;
    auto due_rep = next_due_.load();
    if (due_rep != 0) {
        auto due = clock::time_point(clock::duration(due_rep));
        if (now > due) worst = std::chrono::duration<double>(now - due).count();
    }
    auto now_sec = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    auto win_sec = std::chrono::duration_cast<std::chrono::seconds>(window).count();
    if (win_sec >= slots) win_sec = slots - 1;
    for (std::int64_t s = now_sec - win_sec; s <= now_sec; ++s) {
        if (s < 0) continue;
        if (slot_second_[s % slots].load() == s) worst = std::max(worst, slot_max_[s % slots].load());
    }
    return worst;
}

}  // namespace cg::net
