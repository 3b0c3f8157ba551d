#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

#include "nsq/consumer_core.hpp"
#include "nsq/policy.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

bool consumer::core::below_max_handlers() const {
    return cfg.max_handlers == 0 || workers < cfg.max_handlers;
}

// Below max_handlers a worker is always added; past it only while nothing downstream holds them up.
bool consumer::core::may_add_worker() const {
    if (workers >= cfg.max_in_flight) return false;
    if (cfg.max_handlers == 0 || workers < cfg.max_handlers) return true;
    return cfg.held_up && !cfg.held_up();
}

// One worker woken (or started) per queued message that no woken worker is on its way to yet: a read's wave
// of messages starts in one turn of the loop, not one message per turn (each wake is a completion queued
// behind the loop's next poll). Past max_handlers new workers start one at a time, as each takes its
// message, so held_up() is asked again before every one (a first wave must not start a pipeline for every
// delivery before any of them reached Stripe).
void consumer::core::maybe_wake_worker() {
    while (queued.size() > wakes_pending) {
        if (!parked.empty()) {
            auto* w = parked.back();
            parked.pop_back();
            w->signalled = true;
            ++wakes_pending;
            w->wake.cancel();
        } else if (may_add_worker() && (wakes_pending == 0 || below_max_handlers())) {
            ++workers;
            ++wakes_pending;
            // Started through the executor's queue: co_spawn alone would run the worker (and a handler)
            // right here, inside the read that delivered the message.
            asio::post(ex, [self = shared_from_this()] {
                asio::co_spawn(self->ex, worker_loop(self), handler_task_ended{self->log});
            });
        } else {
            return;
        }
    }
}

asio::awaitable<void> consumer::core::worker_loop(std::shared_ptr<core> self) {
    worker w(self->ex);
    // Counted in wakes_pending from its start or wake until it takes a message or parks (also while it
    // waits for a turn), so no other worker is woken for the message it is on its way to.
    bool on_its_way = true;
    auto arrived = [&] {
        if (on_its_way) --self->wakes_pending;
        on_its_way = false;
    };
    for (;;) {
        if (self->queued.empty()) {
            arrived();
            self->publish_metrics();
            if (self->stopping) break;
            self->parked.push_back(&w);
            co_await w.wake.async_wait(net::nothrow);
            if (w.signalled) {
                w.signalled = false;
                on_its_way = true;
            } else {
                std::erase(self->parked, &w);  // woken by begin_stop()
            }
            continue;
        }
        // A read brings a wave of messages, each handler runs until its first suspension: past the
        // loop's turn budget the next one starts on the next turn, behind sockets and timers.
        if (self->turns.spent()) {
            co_await self->turns.next_turn();
            if (self->queued.empty()) continue;  // another worker took it meanwhile
        }
        auto held = self->queued.pop();
        auto& m = *held;
        arrived();
        self->maybe_wake_worker();
        if (!m.conn()->can_answer(m.ticket())) {
            auto conn = m.conn();  // outlives the message's own reference, dropped with it
            self->drop_deliveries_of(*conn, std::move(held));
            continue;
        }
        ++self->active;
        if (self->active > self->stats.max_handlers) self->stats.max_handlers = self->active;
        // The handler (or give-up), awaited here rather than in a coroutine of its own (one frame less
        // per message). Never throws: an exception out of a handler is a bug in it (dispositions say
        // "keep it"), logged, counted and requeued.
        auto d = disposition::finish();
        bool gave_up = false;
        try {
            if (self->cfg.max_attempts > 0 && m.attempts() > self->cfg.max_attempts) {
                gave_up = true;
                self->log.warn(
                    "message past max_attempts: passing it to the give-up handler",
                    {{"id", m.id()}, {"attempts", m.attempts()}, {"max_attempts", self->cfg.max_attempts}});
                if (self->give_up) d = co_await self->give_up(m);
            } else {
                d = co_await self->handler(m);
            }
        } catch (const std::exception& e) {
            self->handler_failed(m, gave_up, e.what());
            d = disposition::requeue();
            gave_up = false;
        } catch (...) {
            self->handler_failed(m, gave_up, "unknown exception");
            d = disposition::requeue();
            gave_up = false;
        }
        self->apply(m, d, gave_up);
        self->recycle(std::move(held));
        --self->active;
        if (self->drain_waiters > 0) self->changed();
    }
    --self->workers;
}

void consumer::core::recycle(std::unique_ptr<message> m) {
    if (m->body_capacity() > 4096 || spare_messages.size() >= 1024) return;
    if (m->conn() && m->conn()->state() == connection::phase::closed) m->release_connection();
    spare_messages.push_back(std::move(m));
}

void consumer::core::handler_failed(const message& m, bool gave_up, std::string_view what) {
    ++stats.handler_errors;
    metric.handler_errors->Increment();
    log.error(
        gave_up ? "give-up handler threw (a bug): requeueing" : "message handler threw (a bug): requeueing",
        {{"id", m.id()}, {"attempts", m.attempts()}, {"error", what}});
}

void consumer::core::apply(message& m, const disposition& d, bool gave_up) {
    auto& c = m.conn();
    if (d.what() == disposition::kind::finish) {
        if (c->finish(m.ticket())) {
            ++stats.finished;
            ++unpublished.finished;
        } else {
            ++stats.responses_dropped;
        }
        if (gave_up) {
            ++stats.gave_up;
            metric.gave_up->Increment();
        }
        auto ok = handler_signal::success;
        auto key = rdy_key(m);
        if (!rdy.finish_quietly(key, ok))  // the common case: no output, no clock read
            carry_out(rdy.handler_finished(key, ok, sclock::now()));
        return;
    }
    auto delay = d.delay().value_or(
        default_requeue_delay(m.attempts(), cfg.default_requeue_delay, cfg.max_requeue_delay));
    if (c->requeue(m.ticket(), delay)) {
        ++stats.requeued;
        ++unpublished.requeued;
    } else {
        ++stats.responses_dropped;
    }
    carry_out(rdy.handler_finished(
        rdy_key(m),
        d.what() == disposition::kind::requeue ? handler_signal::failure : handler_signal::neutral,
        sclock::now()));
}

}  // namespace cg::nsq
