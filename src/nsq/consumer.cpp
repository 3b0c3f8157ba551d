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
#include "nsq/consumer_core.hpp"
#include "nsq/consumer_metrics.hpp"
#include "nsq/handshake.hpp"
#include "nsq/lookupd_poller.hpp"
#include "nsq/message_queue.hpp"
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
}  // namespace

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

void consumer::core::carry_out(const rdy_output& out) {
    if (out.empty()) return;
    const auto& conns = supervisor->connections();
    for (const auto& cmd : out.rdy)
        if (auto it = conns.find(cmd.conn); it != conns.end()) it->second->send_rdy(cmd.count);
    for (const auto& t : out.timers) arm(t.which, t.after);
    for (const auto& n : out.notes) log_note(n);
    if (!out.rdy.empty()) publish_rdy_total();
}

void consumer::core::publish_rdy_total() {
    stats.total_rdy = rdy.total_sent();
    metric.rdy->Set(static_cast<double>(stats.total_rdy));
    stats.max_total_rdy = rdy.max_committed_total();
}

void consumer::core::arm(rdy_timer which, milliseconds after) {
    auto i = static_cast<std::size_t>(which);
    auto gen = ++timer_gen[i];
    timers[i].expires_after(after);
    timers[i].async_wait([w = weak_from_this(), which, i, gen](std::error_code ec) {
        auto self = w.lock();
        if (!self || ec || self->timer_gen[i] != gen || self->stopping) return;
        self->carry_out(self->rdy.timer_fired(which, sclock::now()));
    });
}

void consumer::core::log_note(const rdy_output::note& n) {
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

void consumer::core::on_subscribed(connection& c) {
    ++stats.connects;
    ++stats.connections;
    subscribed->fetch_add(1);
    metric.connections->Increment();
    if (stopping) {
        c.start_close();
        return;
    }
    carry_out(rdy.connection_added(c.key(), c.max_rdy(), sclock::now()));
}

void consumer::core::on_connection_ended(connection& c, bool was_subscribed) {
    for (auto& m : spare_messages)
        if (m->conn().get() == &c) m->release_connection();
    if (!was_subscribed) return;
    ++stats.disconnects;
    --stats.connections;
    subscribed->fetch_sub(1);
    metric.connections->Decrement();
    carry_out(rdy.connection_removed(c.key(), sclock::now()));
    drop_deliveries_of(c, nullptr);
    publish_rdy_total();
}

void consumer::core::drop_deliveries_of(const connection& c, std::unique_ptr<message> taken) {
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

void consumer::core::count_dropped(unsigned n) {
    stats.dropped += n;
    metric.dropped->Increment(static_cast<double>(n));
}

void consumer::core::on_supervision_changed() {
    stats.task_restarts = supervisor->task_restarts();
    changed();
}

void consumer::core::on_message(const std::shared_ptr<connection>& c, const proto::message_view& v,
                                delivery_ticket t) {
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

void consumer::core::arm_queue_touch() {
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

void consumer::core::touch_queued() {
    auto now = sclock::now();
    queued.for_each([&](message& m) {
        auto due = next_touch(m.last_touched(), m.delivered_at(), m.msg_timeout(), m.max_msg_timeout());
        if (due && *due <= now) m.touch();
    });
    if (!queued.empty()) arm_queue_touch();
}

void consumer::core::on_read_batch(connection& c) {
    if (batch_received > 0) {
        rdy.messages_received(c.key(), batch_received, c.last_read());
        batch_received = 0;
        stats.max_outstanding = std::max(stats.max_outstanding, rdy.pending());
    }
    publish_metrics();
    carry_out(rdy.read_batch_done(c.key()));
}

void consumer::core::publish_metrics() {
    if (unpublished.received) metric.received->Increment(static_cast<double>(unpublished.received));
    if (unpublished.finished) metric.finished->Increment(static_cast<double>(unpublished.finished));
    if (unpublished.requeued) metric.requeued->Increment(static_cast<double>(unpublished.requeued));
    unpublished = {};
    metric.handlers->Set(active);
}

void consumer::core::on_error_frame(connection& c, const proto::error_frame& e) {
    if (e.code == "E_FIN_FAILED") {
        ++stats.fin_failed;
        metric.fin_failed->Increment();
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

void consumer::core::on_touch_sent() {
    ++stats.touches;
    metric.touches->Increment();
}

asio::awaitable<bool> consumer::core::wait_until(sclock::time_point deadline, bool (core::*cond)() const) {
    while (!(this->*cond)()) {
        auto left = deadline - sclock::now();
        if (left <= sclock::duration::zero()) co_return false;
        ++drain_waiters;
        co_await net::with_timeout(change_wake.async_wait(), left);
        --drain_waiters;
    }
    co_return true;
}

void consumer::core::begin_stop() {
    stopping = true;
    supervisor->stop();
    if (poller) poller->stop();
    for (auto& t : timers) t.cancel();
    for (auto* w : parked) w->wake.cancel();  // each exits once the queue is empty
}

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
