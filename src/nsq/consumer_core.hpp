// consumer::core, the NSQ consumer's state and glue, shared by consumer.cpp (RDY commands, supervision
// callbacks, queued deliveries kept alive, the drain) and handler_pool.cpp (the workers that run the
// handlers, dispositions applied as FIN/REQ, recycled messages). Internal to the nsq module. Every member
// runs on the consumer's executor.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/log.hpp"
#include "net/tokens.hpp"
#include "net/turn_budget.hpp"
#include "nsq/connection.hpp"
#include "nsq/consumer.hpp"
#include "nsq/consumer_metrics.hpp"
#include "nsq/lookupd_poller.hpp"
#include "nsq/message_queue.hpp"
#include "nsq/rdy_controller.hpp"
#include "nsq/supervisor.hpp"

namespace cg::nsq {

// The controller's settings from the consumer's configuration (consumer.cpp).
rdy_settings rdy_settings_of(const consumer_config& c);

// The consumer's glue: handler scheduling (max_in_flight handlers, the rest queued), dispositions applied
// as FIN/REQ, metrics, and the drain. RDY and backoff decisions are the rdy_controller's (this only carries
// its commands out and runs its timers); connections are the connection_supervisor's; discovery is the
// lookupd_poller's.
struct consumer::core final : supervisor_owner, std::enable_shared_from_this<core> {
    core(asio::any_io_executor e, consumer_config c, message_handler h, logger l, metrics::registry& reg)
        : ex(e),
          turns(net::turn_budget::of(e)),
          cfg(std::move(c)),
          handler(std::move(h)),
          log(l.with({{"topic", cfg.topic}, {"channel", cfg.channel}})),
          metric(reg, cfg.topic, cfg.channel),
          rdy(rdy_settings_of(cfg)),
          change_wake(e, std::chrono::steady_clock::time_point::max()),
          queue_touch(e),
          timers{net::steady_timer(e), net::steady_timer(e), net::steady_timer(e)} {}

    asio::any_io_executor ex;
    net::turn_budget& turns;  // the loop's (net/turn_budget.hpp)
    consumer_config cfg;
    message_handler handler;
    give_up_handler give_up;
    std::shared_ptr<asio::ssl::context> tls_ctx;  // built at start() when TLS is on
    logger log;
    consumer_stats stats;
    consumer_metrics metric;
    std::shared_ptr<std::atomic<int>> subscribed = std::make_shared<std::atomic<int>>(0);

    bool started = false, stopping = false, stopped = false;
    rdy_controller rdy;  // the one owner of RDY and backoff state
    std::shared_ptr<connection_supervisor> supervisor;
    std::shared_ptr<lookupd_poller> poller;  // with lookupd addresses

    unsigned active = 0;         // handlers running
    ring_queue<message> queued;  // waiting for a handler slot

    net::steady_timer change_wake;
    net::steady_timer queue_touch;  // keeps queued deliveries alive (touch_queued)
    bool queue_touch_armed = false;
    std::array<net::steady_timer, rdy_timer_count> timers;
    std::array<std::uint64_t, rdy_timer_count> timer_gen{};  // filters an expiry that raced a re-arm

    void changed() { change_wake.cancel(); }

    // --- the controller's commands ------------------------------------------------------------------
    void carry_out(const rdy_output& out);
    void publish_rdy_total();
    void arm(rdy_timer which, std::chrono::milliseconds after);

    void log_note(const rdy_output::note& n);

    // --- supervisor_owner ---------------------------------------------------------------------------
    void on_subscribed(connection& c) override;

    void on_connection_ended(connection& c, bool was_subscribed) override;

    // Deliveries of `c` waiting for a handler once `c` can no longer answer them (it failed, or ended): no
    // FIN or REQ would reach nsqd, which redelivers them after msg_timeout (nsqd 1.3.0 does not requeue a
    // dropped client's messages), so running their handlers would be work thrown away — or done twice,
    // once the redelivery arrives. `taken`: one a worker has already taken off the queue. One log line for
    // all of them (a failed read may have brought thousands).
    void drop_deliveries_of(const connection& c, std::unique_ptr<message> taken);

    void count_dropped(unsigned n);

    // The controller's name for the connection a delivery came on: empty once it ended (removed there).
    static std::string_view rdy_key(const message& m) noexcept {
        const auto& c = m.conn();
        return c && c->state() != connection::phase::closed ? std::string_view(c->key()) : std::string_view();
    }

    void on_supervision_changed() override;

    void on_message(const std::shared_ptr<connection>& c, const proto::message_view& v,
                    delivery_ticket t) override;

    // Queued deliveries are kept alive from receipt, as a keepalive would: nsqd's msg_timeout runs from
    // delivery whether or not a handler has started. RDY keeps the deliveries outstanding within
    // max_in_flight, so a queued one normally meets a free worker at once; this covers the rest (a
    // lowered RDY nsqd applied later than the settle delay assumes). One timer for the whole queue, armed
    // for its oldest entry: no per-message timer, and nothing armed while the queue stays short-lived.
    void arm_queue_touch();
    bool may_add_worker() const;
    bool below_max_handlers() const;

    void touch_queued();

    // The controller hears of a read's messages once, at the end of the read (a handler never runs in
    // between: workers resume and start through the executor's queue, never inside the read), instead of
    // a lookup by connection per message.
    unsigned batch_received = 0;
    void on_read_batch(connection& c) override;

    // The per-message metrics go to the registry once per read batch and whenever a worker runs out of
    // work (so they are exact whenever the consumer is idle), not once per message.
    struct {
        std::uint64_t received = 0, finished = 0, requeued = 0;
    } unpublished;
    void publish_metrics();
    void on_error_frame(connection& c, const proto::error_frame& e) override;
    void on_touch_sent() override;

    // --- handlers -----------------------------------------------------------------------------------
    // Handlers run on worker coroutines, at most max_in_flight of them, created as needed and parked when
    // the queue is empty. Each queued message has a worker on its way (woken or started, up to the
    // bound); a worker that takes a message first makes sure of that for the rest, then awaits the handler: a
    // handler that suspends leaves the rest of the queue to the others, one that completes at once lets the
    // same worker take the next message without a post or a coroutine spawn per message.
    struct worker {
        explicit worker(asio::any_io_executor e) : wake(e, std::chrono::steady_clock::time_point::max()) {}
        net::steady_timer wake;
        bool signalled = false;
    };
    std::vector<worker*> parked;
    unsigned workers = 0;
    std::size_t wakes_pending = 0;  // workers woken or started that have not looked at the queue yet
    unsigned drain_waiters = 0;     // wait_until() calls under way

    void maybe_wake_worker();

    static asio::awaitable<void> worker_loop(std::shared_ptr<core> self);

    // Finished messages are kept for reuse (their body storage with them): no allocation per message once
    // the pool holds a read batch's worth (small bodies only, a bounded number). A pooled message keeps its
    // connection until the connection ends (so reusing it for the same connection changes no reference
    // count); on_connection_ended() drops it then.
    std::vector<std::unique_ptr<message>> spare_messages;
    void recycle(std::unique_ptr<message> m);
    void handler_failed(const message& m, bool gave_up, std::string_view what);
    void apply(message& m, const disposition& d, bool gave_up);

    // A worker must not fail (run_handler catches the handler's exceptions): if one does, the handler slot
    // and the message's FIN/REQ are lost, so the process stops loudly instead of stalling.
    struct handler_task_ended {
        logger log;
        void operator()(std::exception_ptr ep) const {
            if (!ep) return;
            log.error("message handler task failed outside the handler: aborting",
                      {{"error", describe_exception(ep)}});
            std::terminate();
        }
    };

    // --- stop ---------------------------------------------------------------------------------------
    asio::awaitable<bool> wait_until(std::chrono::steady_clock::time_point deadline,
                                     bool (core::*cond)() const);
    bool idle() const { return active == 0 && queued.empty(); }
    bool all_closed() const { return supervisor->all_closed(); }

    void begin_stop();
};

}  // namespace cg::nsq
