#include "nsq/consumer.hpp"

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <atomic>
#include <optional>
#include <string_view>

#include "net/address.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "net/turn_budget.hpp"
#include "nsq/connection.hpp"
#include "nsq/handshake.hpp"
#include "nsq/lookupd_poller.hpp"
#include "nsq/policy.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/rdy_controller.hpp"
#include "nsq/supervisor.hpp"
#include "nsq/task.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

namespace {
constexpr auto forever = sclock::time_point::max();

// Messages waiting for a handler, first in first out: a ring over a power-of-two vector that doubles when
// full (no per-node bookkeeping per message, as a deque has).
class message_queue {
  public:
    bool empty() const noexcept { return count_ == 0; }
    std::size_t size() const noexcept { return count_; }
    void push(std::unique_ptr<message> m) {
        if (count_ == ring_.size()) grow();
        ring_[(head_ + count_) & (ring_.size() - 1)] = std::move(m);
        ++count_;
    }
    std::unique_ptr<message> pop() noexcept {
        auto m = std::move(ring_[head_]);
        head_ = (head_ + 1) & (ring_.size() - 1);
        --count_;
        return m;
    }
    template <typename F>
    void for_each(F f) {
        for (std::size_t i = 0; i < count_; ++i) f(*ring_[(head_ + i) & (ring_.size() - 1)]);
    }
    // Takes out every message `pred` selects (order kept), handing each to `taken`.
    template <typename Pred, typename Taken>
    void remove_if(Pred pred, Taken taken) {
        std::size_t kept = 0;
        for (std::size_t i = 0; i < count_; ++i) {
            auto& slot = ring_[(head_ + i) & (ring_.size() - 1)];
            if (pred(*slot)) {
                taken(std::move(slot));
            } else {
                ring_[(head_ + kept++) & (ring_.size() - 1)] = std::move(slot);
            }
        }
        count_ = kept;
    }

  private:
    void grow() {
        std::vector<std::unique_ptr<message>> bigger(std::max<std::size_t>(16, ring_.size() * 2));
        for (std::size_t i = 0; i < count_; ++i)
            bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
        ring_ = std::move(bigger);
        head_ = 0;
    }
    std::vector<std::unique_ptr<message>> ring_;
    std::size_t head_ = 0, count_ = 0;
};

rdy_settings rdy_settings_of(const consumer_config& c) {
    rdy_settings s;
    s.max_in_flight = c.max_in_flight;
    s.low_rdy_idle_timeout = c.low_rdy_idle_timeout;
    s.settle_delay = c.rdy_settle_delay;
    s.redistribute_interval = c.rdy_redistribute_interval;
    s.backoff_multiplier = c.backoff_multiplier;
    s.max_backoff = c.max_backoff_duration;
    return s;
}
}  // namespace

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
          rdy(rdy_settings_of(cfg)),
          change_wake(e, forever),
          queue_touch(e),
          timers{net::steady_timer(e), net::steady_timer(e), net::steady_timer(e)} {
        metrics::labels lb{{"topic", cfg.topic}, {"channel", cfg.channel}};
        m_received = &reg.counter("chargeguard_nsq_messages_received_total", "NSQ messages received").Add(lb);
        m_finished = &reg.counter("chargeguard_nsq_messages_finished_total", "NSQ messages FINed").Add(lb);
        m_requeued = &reg.counter("chargeguard_nsq_messages_requeued_total", "NSQ messages REQed").Add(lb);
        m_gave_up = &reg.counter("chargeguard_nsq_messages_given_up_total",
                                 "NSQ messages past max_attempts passed to the give-up handler")
                         .Add(lb);
        m_fin_failed = &reg.counter("chargeguard_nsq_fin_failed_total",
                                    "E_FIN_FAILED from nsqd: the message had already timed out")
                            .Add(lb);
        m_touches = &reg.counter("chargeguard_nsq_touches_total", "TOUCH commands sent").Add(lb);
        m_dropped = &reg.counter("chargeguard_nsq_messages_dropped_total",
                                 "NSQ messages dropped unhandled: their connection had closed, so no answer "
                                 "could be sent (nsqd redelivers them after msg_timeout)")
                         .Add(lb);
        m_handler_errors =
            &reg.counter("chargeguard_nsq_handler_errors_total",
                         "message or give-up handlers that threw (a bug: the message is requeued)")
                 .Add(lb);
        m_connections = &reg.gauge("chargeguard_nsq_connections", "nsqd connections subscribed").Add(lb);
        m_rdy = &reg.gauge("chargeguard_nsq_rdy", "sum of RDY over all nsqd connections").Add(lb);
        m_handlers = &reg.gauge("chargeguard_nsq_handlers_running", "message handlers running").Add(lb);
    }

    asio::any_io_executor ex;
    net::turn_budget& turns;  // the loop's (net/turn_budget.hpp)
    consumer_config cfg;
    message_handler handler;
    give_up_handler give_up;
    std::shared_ptr<asio::ssl::context> tls_ctx;  // built at start() when TLS is on
    logger log;
    consumer_stats stats;
    metrics::Counter *m_received, *m_finished, *m_requeued, *m_gave_up, *m_fin_failed, *m_touches,
        *m_handler_errors, *m_dropped;
    metrics::Gauge *m_connections, *m_rdy, *m_handlers;
    std::shared_ptr<std::atomic<int>> subscribed = std::make_shared<std::atomic<int>>(0);

    bool started = false, stopping = false, stopped = false;
    rdy_controller rdy;  // the one owner of RDY and backoff state
    std::shared_ptr<connection_supervisor> supervisor;
    std::shared_ptr<lookupd_poller> poller;  // with lookupd addresses

    unsigned active = 0;   // handlers running
    message_queue queued;  // waiting for a handler slot

    net::steady_timer change_wake;
    net::steady_timer queue_touch;  // keeps queued deliveries alive (touch_queued)
    bool queue_touch_armed = false;
    std::array<net::steady_timer, rdy_timer_count> timers;
    std::array<std::uint64_t, rdy_timer_count> timer_gen{};  // filters an expiry that raced a re-arm

    void changed() { change_wake.cancel(); }

    // --- the controller's commands ------------------------------------------------------------------
    void carry_out(const rdy_output& out) {
        if (out.empty()) return;
        const auto& conns = supervisor->connections();
        for (const auto& cmd : out.rdy)
            if (auto it = conns.find(cmd.conn); it != conns.end()) it->second->send_rdy(cmd.count);
        for (const auto& t : out.timers) arm(t.which, t.after);
        for (const auto& n : out.notes) log_note(n);
        if (!out.rdy.empty()) publish_rdy_total();
    }

    void publish_rdy_total() {
        stats.total_rdy = rdy.total_sent();
        m_rdy->Set(static_cast<double>(stats.total_rdy));
        stats.max_total_rdy = rdy.max_committed_total();
    }

    void arm(rdy_timer which, milliseconds after) {
        auto i = static_cast<std::size_t>(which);
        auto gen = ++timer_gen[i];
        timers[i].expires_after(after);
        timers[i].async_wait([w = weak_from_this(), which, i, gen](std::error_code ec) {
            auto self = w.lock();
            if (!self || ec || self->timer_gen[i] != gen || self->stopping) return;
            self->carry_out(self->rdy.timer_fired(which, sclock::now()));
        });
    }

    void log_note(const rdy_output::note& n) {
        using k = rdy_output::note_kind;
        switch (n.kind) {
            case k::backoff_started:
                log.warn("handler failure: backing off, RDY 0 on every connection",
                         {{"ms", static_cast<std::int64_t>(n.after.count())}, {"level", n.level}});
                break;
            case k::backoff_ended:
                log.warn("exiting backoff: returning to full RDY");
                break;
            case k::trial:
                log.warn("backoff timeout expired: RDY 1 on one connection", {{"nsqd", n.conn}});
                break;
            case k::trial_lost:
                log.warn("backoff: the trial connection is gone; testing again after the backoff delay",
                         {{"level", n.level}, {"ms", static_cast<std::int64_t>(n.after.count())}});
                break;
        }
    }

    // --- supervisor_owner ---------------------------------------------------------------------------
    void on_subscribed(connection& c) override {
        ++stats.connects;
        ++stats.connections;
        subscribed->fetch_add(1);
        m_connections->Increment();
        if (stopping) {
            c.start_close();
            return;
        }
        carry_out(rdy.connection_added(c.key(), c.max_rdy(), sclock::now()));
    }

    void on_connection_ended(connection& c, bool was_subscribed) override {
        for (auto& m : spare_messages)
            if (m->conn().get() == &c) m->release_connection();
        if (!was_subscribed) return;
        ++stats.disconnects;
        --stats.connections;
        subscribed->fetch_sub(1);
        m_connections->Decrement();
        carry_out(rdy.connection_removed(c.key(), sclock::now()));
        drop_deliveries_of(c, nullptr);
        publish_rdy_total();
    }

    // Deliveries of `c` waiting for a handler once `c` can no longer answer them (it failed, or ended): no
    // FIN or REQ would reach nsqd, which redelivers them after msg_timeout (nsqd 1.3.0 does not requeue a
    // dropped client's messages), so running their handlers would be work thrown away — or done twice,
    // once the redelivery arrives. `taken`: one a worker has already taken off the queue. One log line for
    // all of them (a failed read may have brought thousands).
    void drop_deliveries_of(const connection& c, std::unique_ptr<message> taken) {
        unsigned n = 0;
        auto drop = [&](std::unique_ptr<message> m) {
            ++n;
            recycle(std::move(m));
        };
        if (taken) drop(std::move(taken));
        queued.remove_if([&](const message& m) { return m.conn().get() == &c; }, drop);
        if (n == 0) return;
        count_dropped(n);
        log.warn(
            "dropping deliveries of a closed connection without running their handlers (nsqd "
            "redelivers them after msg_timeout)",
            {{"nsqd", c.key()}, {"dropped", n}});
        // Once it ended the controller counts them as orphans (connection_removed), before that as its.
        auto key = c.state() == connection::phase::closed ? std::string_view() : std::string_view(c.key());
        carry_out(rdy.deliveries_dropped(key, n, sclock::now()));
        if (drain_waiters > 0) changed();
    }

    void count_dropped(unsigned n) {
        stats.dropped += n;
        m_dropped->Increment(static_cast<double>(n));
    }

    // The controller's name for the connection a delivery came on: empty once it ended (removed there).
    static std::string_view rdy_key(const message& m) noexcept {
        const auto& c = m.conn();
        return c && c->state() != connection::phase::closed ? std::string_view(c->key()) : std::string_view();
    }

    void on_supervision_changed() override {
        stats.task_restarts = supervisor->task_restarts();
        changed();
    }

    void on_message(const std::shared_ptr<connection>& c, const proto::message_view& v,
                    delivery_ticket t) override {
        ++stats.received;
        ++unpublished.received;
        ++batch_received;
        auto now = c->last_read();  // the receipt time (keepalive times the first TOUCH from it)
        auto timeout = c->msg_timeout();
        auto max_timeout = milliseconds(c->negotiated().max_msg_timeout);
        if (spare_messages.empty()) {
            queued.push(std::make_unique<message>(v, c, t, now, timeout, max_timeout));
        } else {
            auto m = std::move(spare_messages.back());
            spare_messages.pop_back();
            m->reset(v, c, t, now, timeout, max_timeout);
            queued.push(std::move(m));
        }
        if (!queue_touch_armed) arm_queue_touch();
        maybe_wake_worker();
    }

    // Queued deliveries are kept alive from receipt, as a keepalive would: nsqd's msg_timeout runs from
    // delivery whether or not a handler has started. RDY keeps the deliveries outstanding within
    // max_in_flight, so a queued one normally meets a free worker at once; this covers the rest (a
    // lowered RDY nsqd applied later than the settle delay assumes). One timer for the whole queue, armed
    // for its oldest entry: no per-message timer, and nothing armed while the queue stays short-lived.
    void arm_queue_touch() {
        std::optional<sclock::time_point> first;
        queued.for_each([&](message& m) {
            auto due = next_touch(m.last_touched(), m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
            if (due && (!first || *due < *first)) first = due;
        });
        if (!first || stopped) return;
        queue_touch_armed = true;
        queue_touch.expires_at(*first);
        queue_touch.async_wait([w = weak_from_this()](std::error_code ec) {
            auto self = w.lock();
            if (!self) return;
            self->queue_touch_armed = false;
            if (!ec) self->touch_queued();
        });
    }

    void touch_queued() {
        auto now = sclock::now();
        queued.for_each([&](message& m) {
            auto due = next_touch(m.last_touched(), m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
            if (due && *due <= now) m.touch();
        });
        if (!queued.empty()) arm_queue_touch();
    }

    // The controller hears of a read's messages once, at the end of the read (a handler never runs in
    // between: workers resume and start through the executor's queue, never inside the read), instead of
    // a lookup by connection per message.
    unsigned batch_received = 0;
    void on_read_batch(connection& c) override {
        if (batch_received > 0) {
            rdy.messages_received(c.key(), batch_received, c.last_read());
            batch_received = 0;
            stats.max_outstanding = std::max(stats.max_outstanding, rdy.pending());
        }
        publish_metrics();
        carry_out(rdy.read_batch_done(c.key()));
    }

    // The per-message metrics go to the registry once per read batch and whenever a worker runs out of
    // work (so they are exact whenever the consumer is idle), not once per message.
    struct {
        std::uint64_t received = 0, finished = 0, requeued = 0;
    } unpublished;
    void publish_metrics() {
        if (unpublished.received) m_received->Increment(static_cast<double>(unpublished.received));
        if (unpublished.finished) m_finished->Increment(static_cast<double>(unpublished.finished));
        if (unpublished.requeued) m_requeued->Increment(static_cast<double>(unpublished.requeued));
        unpublished = {};
        m_handlers->Set(active);
    }

    void on_error_frame(connection& c, const proto::error_frame& e) override {
        if (e.code == "E_FIN_FAILED") {
            ++stats.fin_failed;
            m_fin_failed->Increment();
            log.warn("FIN failed: the message had timed out at nsqd and will be redelivered",
                     {{"nsqd", c.key()}, {"error", e.text}});
        } else if (e.code == "E_REQ_FAILED") {
            ++stats.req_failed;
            log.warn("REQ failed", {{"nsqd", c.key()}, {"error", e.text}});
        } else if (e.code == "E_TOUCH_FAILED") {
            ++stats.touch_failed;
            log.warn("TOUCH failed", {{"nsqd", c.key()}, {"error", e.text}});
        } else {
            log.error("fatal error from nsqd", {{"nsqd", c.key()}, {"error", e.text}});
        }
    }

    void on_touch_sent() override {
        ++stats.touches;
        m_touches->Increment();
    }

    // --- handlers -----------------------------------------------------------------------------------
    // Handlers run on worker coroutines, at most max_in_flight of them, created as needed and parked when
    // the queue is empty. A worker that takes a message first makes sure another one will look at the
    // queue if it is not empty (wakes a parked one or starts one), then awaits the handler: a handler that
    // suspends leaves the rest of the queue to the others, one that completes at once lets the same worker
    // take the next message without a post or a coroutine spawn per message.
    struct worker {
        explicit worker(asio::any_io_executor e) : wake(e, forever) {}
        net::steady_timer wake;
        bool signalled = false;
    };
    std::vector<worker*> parked;
    unsigned workers = 0;
    bool wake_pending = false;   // a worker was woken or started and has not looked at the queue yet
    unsigned drain_waiters = 0;  // wait_until() calls under way

    void maybe_wake_worker() {
        if (queued.empty() || wake_pending) return;
        if (!parked.empty()) {
            auto* w = parked.back();
            parked.pop_back();
            w->signalled = true;
            wake_pending = true;
            w->wake.cancel();
        } else if (workers < cfg.max_in_flight) {
            ++workers;
            wake_pending = true;
            // Started through the executor's queue: co_spawn alone would run the worker (and a handler)
            // right here, inside the read that delivered the message.
            asio::post(ex, [self = shared_from_this()] {
                asio::co_spawn(self->ex, worker_loop(self), handler_task_ended{self->log});
            });
        }
    }

    static asio::awaitable<void> worker_loop(std::shared_ptr<core> self) {
        worker w(self->ex);
        self->wake_pending = false;  // a new worker looks at the queue now
        for (;;) {
            if (self->queued.empty()) {
                self->publish_metrics();
                if (self->stopping) break;
                self->parked.push_back(&w);
                co_await w.wake.async_wait(net::nothrow);
                if (w.signalled) {
                    w.signalled = false;
                    self->wake_pending = false;
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
                    self->log.warn("message past max_attempts: passing it to the give-up handler",
                                   {{"id", m.id()},
                                    {"attempts", m.attempts()},
                                    {"max_attempts", self->cfg.max_attempts}});
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

    // Finished messages are kept for reuse (their body storage with them): no allocation per message once
    // the pool holds a read batch's worth (small bodies only, a bounded number). A pooled message keeps its
    // connection until the connection ends (so reusing it for the same connection changes no reference
    // count); on_connection_ended() drops it then.
    std::vector<std::unique_ptr<message>> spare_messages;
    void recycle(std::unique_ptr<message> m) {
        if (m->body_capacity() > 4096 || spare_messages.size() >= 1024) return;
        if (m->conn() && m->conn()->state() == connection::phase::closed) m->release_connection();
        spare_messages.push_back(std::move(m));
    }

    void handler_failed(const message& m, bool gave_up, std::string_view what) {
        ++stats.handler_errors;
        m_handler_errors->Increment();
        log.error(gave_up ? "give-up handler threw (a bug): requeueing"
                          : "message handler threw (a bug): requeueing",
                  {{"id", m.id()}, {"attempts", m.attempts()}, {"error", what}});
    }

    void apply(message& m, const disposition& d, bool gave_up) {
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
                m_gave_up->Increment();
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
    asio::awaitable<bool> wait_until(sclock::time_point deadline, bool (core::*cond)() const) {
        while (!(this->*cond)()) {
            auto left = deadline - sclock::now();
            if (left <= sclock::duration::zero()) co_return false;
            ++drain_waiters;
            co_await net::with_timeout(change_wake.async_wait(), left);
            --drain_waiters;
        }
        co_return true;
    }
    bool idle() const { return active == 0 && queued.empty(); }
    bool all_closed() const { return supervisor->all_closed(); }

    void begin_stop() {
        stopping = true;
        supervisor->stop();
        if (poller) poller->stop();
        for (auto& t : timers) t.cancel();
        for (auto* w : parked) w->wake.cancel();  // each exits once the queue is empty
    }
};

consumer::consumer(asio::any_io_executor ex, consumer_config cfg, message_handler handler, logger log,
                   metrics::registry& reg)
    : core_(std::make_shared<core>(ex, std::move(cfg), std::move(handler), std::move(log), reg)) {
    core_->supervisor = std::make_shared<connection_supervisor>(ex, core_->cfg, core_->log, nullptr,
                                                                std::weak_ptr<supervisor_owner>(core_));
}

consumer::~consumer() {
    core_->begin_stop();
    core_->supervisor->abort_all();
}

void consumer::set_give_up_handler(give_up_handler h) {
    core_->give_up = std::move(h);
}

void consumer::add_readiness(metrics::health& h) {
    std::shared_ptr<std::atomic<int>> n = core_->subscribed;
    h.add_readiness("nsq", [n]() {
        int v = n->load();
        return metrics::check_status{v > 0, std::to_string(v) + " nsqd connection(s) subscribed"};
    });
}

result<void> consumer::start() {
    if (auto v = validate(core_->cfg); !v) return v;
    if (core_->started) return error(errc::bad_config, "consumer already started");
    auto tls = make_nsq_tls_context(core_->cfg.security);
    if (!tls) return tls.err();
    core_->tls_ctx = *tls;
    core_->started = true;
    auto& c = *core_;
    if (c.cfg.client_id.empty()) c.cfg.client_id = short_hostname();
    if (c.cfg.hostname.empty()) c.cfg.hostname = local_hostname();
    c.supervisor->set_tls(c.tls_ctx);
    c.carry_out(c.rdy.start());
    for (const auto& a : c.cfg.nsqd_tcp_addresses)
        c.supervisor->add_static(net::parse_host_port(a)->to_string());
    if (!c.cfg.lookupd_http_addresses.empty()) {
        std::weak_ptr<core> w = core_;
        c.poller =
            std::make_shared<lookupd_poller>(c.ex, c.cfg, c.log, [w](const std::set<std::string>& keys) {
                auto self = w.lock();
                if (!self) return;
                ++self->stats.lookups_answered;
                for (const auto& key : keys) self->supervisor->ensure(key, true);
            });
        c.supervisor->set_poller(c.poller);
        c.poller->start();
    }
    c.log.info("consumer started",
               {{"max_in_flight", c.cfg.max_in_flight},
                {"nsqd", static_cast<std::uint64_t>(c.cfg.nsqd_tcp_addresses.size())},
                {"lookupd", static_cast<std::uint64_t>(c.cfg.lookupd_http_addresses.size())}});
    return {};
}

asio::awaitable<void> consumer::stop() {
    auto c = core_;  // the consumer may be destroyed by whoever awaited us only after we return
    if (c->stopped) co_return;
    if (c->stopping) {
        co_await c->wait_until(forever, &core::all_closed);
        co_return;
    }
    c->begin_stop();
    auto deadline = sclock::now() + c->cfg.drain_timeout;
    c->log.info("draining",
                {{"handlers", c->active}, {"queued", static_cast<std::uint64_t>(c->queued.size())}});
    c->carry_out(c->rdy.stop());  // RDY 0 everywhere
    c->publish_rdy_total();
    bool idle = co_await c->wait_until(deadline, &core::idle);
    if (!idle) c->log.warn("drain timeout: handlers still running", {{"handlers", c->active}});
    for (auto& [k, conn] : c->supervisor->connections()) {
        if (conn->subscribed()) {
            conn->start_close();
        } else if (conn->state() == connection::phase::connecting) {
            conn->abort();
        }
    }
    // Each connection closes itself after CLOSE_WAIT once its last FIN is written.
    auto close_deadline = std::max(deadline, sclock::now() + seconds(1));
    if (!co_await c->wait_until(close_deadline, &core::all_closed)) {
        c->log.warn("drain timeout: closing connections");
        c->supervisor->abort_all();
        co_await c->wait_until(sclock::now() + seconds(5), &core::all_closed);
    }
    c->stopped = true;
    c->publish_metrics();
    c->log.info(
        "consumer stopped",
        {{"received", c->stats.received}, {"finished", c->stats.finished}, {"requeued", c->stats.requeued}});
}

const consumer_stats& consumer::stats() const {
    return core_->stats;
}
std::size_t consumer::subscribed_connections() const {
    return static_cast<std::size_t>(core_->subscribed->load());
}
const consumer_config& consumer::config() const {
    return core_->cfg;
}

}  // namespace cg::nsq
