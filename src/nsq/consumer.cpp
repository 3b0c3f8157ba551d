#include "nsq/consumer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <atomic>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "net/address.hpp"
#include "net/resolve.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsq/connection.hpp"
#include "nsq/handshake.hpp"
#include "nsq/lookupd_poller.hpp"
#include "nsq/policy.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

namespace {
constexpr auto forever = sclock::time_point::max();
}

struct consumer::core final : connection_owner, std::enable_shared_from_this<core> {
    core(asio::any_io_executor e, consumer_config c, message_handler h, logger l, metrics::registry& reg)
        : ex(e),
          cfg(std::move(c)),
          handler(std::move(h)),
          log(l.with({{"topic", cfg.topic}, {"channel", cfg.channel}})),
          backoff(cfg.backoff_multiplier, cfg.max_backoff_duration),
          stop_wake(e, forever),
          change_wake(e, forever),
          backoff_timer(e),
          settle_timer(e),
          rng(std::random_device{}()) {
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
        m_handler_errors =
            &reg.counter("chargeguard_nsq_handler_errors_total",
                         "message or give-up handlers that threw (a bug: the message is requeued)")
                 .Add(lb);
        m_connections = &reg.gauge("chargeguard_nsq_connections", "nsqd connections subscribed").Add(lb);
        m_rdy = &reg.gauge("chargeguard_nsq_rdy", "sum of RDY over all nsqd connections").Add(lb);
        m_handlers = &reg.gauge("chargeguard_nsq_handlers_running", "message handlers running").Add(lb);
    }

    asio::any_io_executor ex;
    consumer_config cfg;
    message_handler handler;
    give_up_handler give_up;
    std::shared_ptr<asio::ssl::context> tls_ctx;  // built at start() when TLS is on
    logger log;
    consumer_stats stats;
    metrics::Counter *m_received, *m_finished, *m_requeued, *m_gave_up, *m_fin_failed, *m_touches,
        *m_handler_errors;
    metrics::Gauge *m_connections, *m_rdy, *m_handlers;
    std::shared_ptr<std::atomic<int>> subscribed = std::make_shared<std::atomic<int>>(0);

    bool started = false, stopping = false, stopped = false;
    std::map<std::string, std::shared_ptr<connection>> conns;  // live (connecting or subscribed)
    std::set<std::string> supervised;                          // keys with a supervisor running
    std::set<std::string> static_keys;
    std::shared_ptr<lookupd_poller> poller;  // with lookupd addresses

    unsigned active = 0;         // handlers running
    std::deque<message> queued;  // waiting for a handler slot

    backoff_policy backoff;
    std::size_t rr_cursor = 0;
    bool settle_pending = false;

    net::steady_timer stop_wake, change_wake, backoff_timer, settle_timer;
    std::mt19937_64 rng;

    double unit() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }
    void changed() { change_wake.cancel(); }

    // --- connection_owner ---------------------------------------------------------------------------
    void on_subscribed(connection& c) override {
        ++stats.connects;
        ++stats.connections;
        subscribed->fetch_add(1);
        m_connections->Increment();
        c.rdy = rdy_state{};
        c.rdy.last_active = sclock::now();
        if (stopping) {
            c.start_close();
            return;
        }
        rebalance();
        keep_backoff_going();
    }

    void on_message(const std::shared_ptr<connection>& c, const proto::message_view& v) override {
        ++stats.received;
        m_received->Increment();
        message m(v, c, sclock::now(), c->msg_timeout(), milliseconds(c->negotiated().max_msg_timeout));
        if (active < cfg.max_in_flight) {
            spawn_handler(std::move(m));
        } else {
            queued.push_back(std::move(m));
        }
    }

    void on_read_batch(connection& c) override { maybe_resend_rdy(c); }

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
    void spawn_handler(message m) {
        ++active;
        stats.max_handlers = std::max<std::uint64_t>(stats.max_handlers, active);
        m_handlers->Set(active);
        asio::co_spawn(ex, run_handler(shared_from_this(), std::move(m)), handler_task_ended{log});
    }

    // Runs the handler (or give-up) for one message and applies its disposition. Never throws: an exception
    // out of a handler is a bug in it (dispositions say "keep it"), logged, counted and requeued.
    static asio::awaitable<void> run_handler(std::shared_ptr<core> self, message m) {
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
        self->handler_done();
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
            if (c->finish(m.raw_id())) {
                ++stats.finished;
                m_finished->Increment();
            } else {
                ++stats.responses_dropped;
            }
            if (gave_up) {
                ++stats.gave_up;
                m_gave_up->Increment();
            }
            act(backoff.on_success());
            return;
        }
        auto delay = d.delay().value_or(
            default_requeue_delay(m.attempts(), cfg.default_requeue_delay, cfg.max_requeue_delay));
        if (c->requeue(m.raw_id(), delay)) {
            ++stats.requeued;
            m_requeued->Increment();
        } else {
            ++stats.responses_dropped;
        }
        act(d.what() == disposition::kind::requeue ? backoff.on_failure() : backoff.on_continue());
    }

    void handler_done() {
        --active;
        while (!queued.empty() && active < cfg.max_in_flight) {
            auto m = std::move(queued.front());
            queued.pop_front();
            spawn_handler(std::move(m));
        }
        m_handlers->Set(active);
        changed();
    }

    // --- RDY ----------------------------------------------------------------------------------------
    std::vector<connection*> live_subscribed() {
        std::vector<connection*> out;
        for (auto& [k, c] : conns)
            if (c->subscribed()) out.push_back(c.get());
        return out;
    }

    std::uint64_t committed_total() {
        std::uint64_t t = 0;
        for (auto& [k, c] : conns)
            if (c->state() != connection::phase::closed) t += c->rdy.committed;
        return t;
    }

    void publish_rdy_total() {
        std::uint64_t sent = 0;
        for (auto& [k, c] : conns) sent += c->rdy.sent;
        stats.total_rdy = sent;
        m_rdy->Set(static_cast<double>(sent));
        stats.max_total_rdy = std::max(stats.max_total_rdy, committed_total());
    }

    // Sends RDY n. A decrease keeps the old value "committed" until the settle timer: nsqd may not
    // have applied it yet, so the freed budget is not handed to another connection before then.
    void set_rdy(connection& c, unsigned n) {
        if (n == c.rdy.sent && n == c.rdy.remaining) return;
        if (c.rdy.sent == 0 && n > 0) c.rdy.last_active = sclock::now();
        c.send_rdy(n);
        if (n >= c.rdy.committed) {
            c.rdy.committed = n;
        } else {
            schedule_settle();
        }
        c.rdy.sent = n;
        c.rdy.remaining = n;
        publish_rdy_total();
    }

    void schedule_settle() {
        if (settle_pending) return;
        settle_pending = true;
        settle_timer.expires_after(cfg.rdy_settle_delay);
        settle_timer.async_wait([w = weak_from_this()](std::error_code ec) {
            auto self = w.lock();
            if (!self) return;
            self->settle_pending = false;
            if (ec) return;
            for (auto& [k, c] : self->conns) c->rdy.committed = c->rdy.sent;
            self->rebalance(false);
        });
    }

    // Applies each connection's planned RDY: decreases now, increases within what max_in_flight leaves
    // once the committed RDY of the others is counted (the rest after the settle delay). `recompute`
    // makes a new plan (plan_rdy) first; the settle timer applies the pending one as it was.
    void rebalance(bool recompute = true) {
        if (stopping || backoff.backing_off()) return;
        auto live = live_subscribed();
        if (live.empty()) return;
        if (recompute) {
            std::vector<rdy_conn> in;
            auto now = sclock::now();
            for (auto* c : live) in.push_back({c->rdy.sent, c->max_rdy(), now - c->rdy.last_active});
            auto target = plan_rdy(in, cfg.max_in_flight, cfg.low_rdy_idle_timeout, rr_cursor);
            for (std::size_t i = 0; i < live.size(); ++i) live[i]->rdy.target = target[i];
        }
        for (auto* c : live)
            if (c->rdy.target < c->rdy.sent) set_rdy(*c, c->rdy.target);
        for (auto* c : live) {
            if (c->rdy.target <= c->rdy.sent) continue;
            auto others = committed_total() - c->rdy.committed;
            unsigned room =
                others >= cfg.max_in_flight ? 0 : cfg.max_in_flight - static_cast<unsigned>(others);
            unsigned allowed = std::min(c->rdy.target, room);
            if (allowed > c->rdy.sent) set_rdy(*c, allowed);
            if (allowed < c->rdy.target) schedule_settle();
        }
    }

    // go-nsq's "re-send when low": the count nsqd allows is spent as messages arrive.
    void maybe_resend_rdy(connection& c) {
        if (stopping || backoff.backing_off() || !c.subscribed() || c.rdy.sent == 0) return;
        if (c.rdy.remaining <= 1 || c.rdy.remaining < c.rdy.sent / 4) {
            c.send_rdy(c.rdy.sent);
            c.rdy.remaining = c.rdy.sent;
        }
    }

    void act(backoff_policy::decision d) {
        if (stopping) return;
        if (d.act == backoff_policy::action::resume_all) {
            log.warn("exiting backoff: returning to full RDY");
            rebalance();
        } else if (d.act == backoff_policy::action::backoff) {
            log.warn("handler failure: backing off, RDY 0 on every connection",
                     {{"ms", static_cast<std::int64_t>(d.duration.count())}, {"level", backoff.level()}});
            for (auto& [k, c] : conns)
                if (c->subscribed()) set_rdy(*c, 0);
            start_backoff_timer(d.duration);
        }
    }

    void start_backoff_timer(milliseconds d) {
        backoff_timer.expires_after(d);
        backoff_timer.async_wait([w = weak_from_this()](std::error_code ec) {
            auto self = w.lock();
            if (!self || ec || self->stopping) return;
            self->backoff.timeout_expired();
            self->resume_one();
        });
    }

    // While backing off, something must always be under way: the backoff timer, the trial RDY 1 on a
    // live connection, or a handler whose result decides the next step. When the connection holding the
    // trial RDY 1 drops (or the trial never found a connection), none is: arm the timer again so a new
    // trial goes out — otherwise RDY stays 0 everywhere with no handler running, for ever.
    void keep_backoff_going() {
        if (stopping) return;
        backoff_progress p{backoff.backing_off(), backoff.in_timeout(), false, active > 0 || !queued.empty()};
        for (auto& [k, c] : conns)
            if (c->subscribed() && c->rdy.sent > 0) p.trial_out = true;
        if (!backoff_needs_rearm(p)) return;
        log.warn("backoff: the trial connection is gone; testing again after the backoff delay",
                 {{"level", backoff.level()}});
        backoff.on_continue();  // back in the timeout
        start_backoff_timer(backoff.duration_for(backoff.level()));
    }

    // After a backoff timeout: RDY 1 on one connection to test the waters (go-nsq).
    void resume_one() {
        if (!backoff.backing_off()) {
            rebalance();
            return;
        }
        auto live = live_subscribed();
        if (live.empty()) {
            backoff.on_continue();  // re-arms the timeout flag
            start_backoff_timer(seconds(1));
            return;
        }
        auto* c = live[static_cast<std::size_t>(unit() * static_cast<double>(live.size())) % live.size()];
        log.warn("backoff timeout expired: RDY 1 on one connection", {{"nsqd", c->key()}});
        set_rdy(*c, 1);
    }

    // --- connections --------------------------------------------------------------------------------
    void ensure_supervisor(const std::string& key, bool discovered) {
        if (stopping || supervised.contains(key)) return;
        supervised.insert(key);
        asio::co_spawn(ex, supervise(shared_from_this(), key, discovered),
                       task_ended{weak_from_this(), task::supervisor, key, discovered});
    }

    // Which background task a completion belongs to (restarted after an exception).
    enum class task { supervisor, rotation };

    // Completion of a background task: an exception is a bug, never a reason to silently lose an nsqd
    // connection, the lookupd polling or the RDY rotation. Log it and start the task again.
    struct task_ended {
        std::weak_ptr<core> w;
        task which;
        std::string key;
        bool discovered = false;
        void operator()(std::exception_ptr ep) const {
            if (!ep) return;
            auto self = w.lock();
            if (!self) return;
            self->log.error("consumer task failed: restarting it",
                            {{"task", which == task::supervisor ? "nsqd supervisor" : "RDY rotation"},
                             {"nsqd", key},
                             {"error", describe(ep)}});
            ++self->stats.task_restarts;
            self->restart(which, key, discovered);
        }
    };

    // A handler task must not fail (run_handler catches the handler's exceptions): if one does, the
    // handler slot and the message's FIN/REQ are lost, so the process stops loudly instead of stalling.
    struct handler_task_ended {
        logger log;
        void operator()(std::exception_ptr ep) const {
            if (!ep) return;
            log.error("message handler task failed outside the handler: aborting", {{"error", describe(ep)}});
            std::terminate();
        }
    };

    static std::string describe(std::exception_ptr ep) {
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            return e.what();
        } catch (...) {
            return "unknown exception";
        }
    }

    void restart(task which, const std::string& key, bool discovered) {
        if (stopping) {
            supervised.erase(key);
            changed();
            return;
        }
        switch (which) {
            case task::supervisor:
                supervised.erase(key);
                conns.erase(key);
                ensure_supervisor(key, discovered);
                break;
            case task::rotation:
                asio::co_spawn(ex, rotation(shared_from_this()),
                               task_ended{weak_from_this(), task::rotation, {}, false});
                break;
        }
    }

    static asio::awaitable<void> rotation(std::shared_ptr<core> c) {
        while (!c->stopping) {
            co_await net::with_timeout(c->stop_wake.async_wait(), c->cfg.rdy_redistribute_interval);
            if (c->stopping) break;
            c->rebalance();
        }
    }

    // Connects to `key` again and again with exponential backoff until stopping, or — for an address
    // found through lookupd — until the last poll no longer lists it.
    static asio::awaitable<void> supervise(std::shared_ptr<core> self, std::string key, bool discovered) {
        unsigned failures = 0;
        while (!self->stopping) {
            if (discovered && !(self->poller && self->poller->lists(key)) && !self->static_keys.contains(key))
                break;
            bool was_subscribed = co_await self->connect_once(key);
            if (self->stopping) break;
            failures = was_subscribed ? 1 : failures + 1;
            if (discovered && self->poller) self->poller->request_poll();
            auto delay = reconnect_delay(failures, self->cfg.reconnect_backoff_min,
                                         self->cfg.reconnect_backoff_max, self->unit());
            self->log.info("reconnecting",
                           {{"nsqd", key}, {"in_ms", static_cast<std::int64_t>(delay.count())}});
            co_await net::with_timeout(self->stop_wake.async_wait(), delay);
        }
        self->supervised.erase(key);
        self->changed();
    }

    // One connection's life. Returns whether it got as far as subscribing.
    asio::awaitable<bool> connect_once(const std::string& key) {
        auto hp = net::parse_host_port(key);
        if (!hp) co_return false;
        auto eps = co_await resolve_all(*hp, cfg.connect_timeout, cfg.resolver);
        if (!eps) {
            log.warn("cannot resolve nsqd", {{"nsqd", key}, {"error", eps.err().message}});
            co_return false;
        }
        auto c = std::make_shared<connection>(ex, key, cfg, this, log, tls_ctx);
        conns[key] = c;
        auto err = co_await c->run(std::move(*eps));
        bool was_subscribed = c->ever_subscribed();
        conns.erase(key);
        if (was_subscribed) {
            ++stats.disconnects;
            --stats.connections;
            subscribed->fetch_sub(1);
            m_connections->Decrement();
            publish_rdy_total();
            rebalance();
            keep_backoff_going();
        }
        changed();
        if (err) {
            log.warn(was_subscribed ? "nsqd connection lost" : "nsqd connection failed",
                     {{"nsqd", key}, {"error", err.describe()}});
        } else {
            log.info("nsqd connection closed", {{"nsqd", key}});
        }
        co_return was_subscribed;
    }

    // --- stop ---------------------------------------------------------------------------------------
    asio::awaitable<bool> wait_until(sclock::time_point deadline, bool (core::*cond)() const) {
        while (!(this->*cond)()) {
            auto left = deadline - sclock::now();
            if (left <= sclock::duration::zero()) co_return false;
            co_await net::with_timeout(change_wake.async_wait(), left);
        }
        co_return true;
    }
    bool idle() const { return active == 0 && queued.empty(); }
    bool all_closed() const { return conns.empty() && supervised.empty(); }

    void begin_stop() {
        stopping = true;
        stop_wake.cancel();
        if (poller) poller->stop();
        backoff_timer.cancel();
        settle_timer.cancel();
    }

    void abort_all() {
        for (auto& [k, c] : conns) c->abort();
    }
};

consumer::consumer(asio::any_io_executor ex, consumer_config cfg, message_handler handler, logger log,
                   metrics::registry& reg)
    : core_(std::make_shared<core>(ex, std::move(cfg), std::move(handler), std::move(log), reg)) {}

consumer::~consumer() {
    core_->begin_stop();
    core_->abort_all();
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
    for (const auto& a : c.cfg.nsqd_tcp_addresses) {
        auto key = net::parse_host_port(a)->to_string();
        c.static_keys.insert(key);
        c.ensure_supervisor(key, false);
    }
    if (!c.cfg.lookupd_http_addresses.empty()) {
        std::weak_ptr<core> w = core_;
        c.poller =
            std::make_shared<lookupd_poller>(c.ex, c.cfg, c.log, [w](const std::set<std::string>& keys) {
                auto self = w.lock();
                if (!self) return;
                for (const auto& key : keys) self->ensure_supervisor(key, true);
            });
        c.poller->start();
    }
    asio::co_spawn(c.ex, core::rotation(core_), core::task_ended{core_, core::task::rotation, {}, false});
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
    for (auto& [k, conn] : c->conns)
        if (conn->subscribed()) {
            conn->send_rdy(0);
            conn->rdy.sent = 0;
        }
    c->publish_rdy_total();
    bool idle = co_await c->wait_until(deadline, &core::idle);
    if (!idle) c->log.warn("drain timeout: handlers still running", {{"handlers", c->active}});
    for (auto& [k, conn] : c->conns) {
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
        c->abort_all();
        co_await c->wait_until(sclock::now() + seconds(5), &core::all_closed);
    }
    c->stopped = true;
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
