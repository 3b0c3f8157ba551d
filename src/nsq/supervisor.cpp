#include "nsq/supervisor.hpp"

#include <asio/co_spawn.hpp>

#include "net/address.hpp"
#include "net/timeout.hpp"
#include "nsq/lookupd_poller.hpp"
#include "nsq/policy.hpp"
#include "nsq/task.hpp"
#include "nsq/transport.hpp"

namespace cg::nsq {

using namespace std::chrono;

connection_supervisor::connection_supervisor(asio::any_io_executor ex, const consumer_config& cfg, logger log,
                                             std::shared_ptr<asio::ssl::context> tls,
                                             std::weak_ptr<supervisor_owner> owner)
    : ex_(ex),
      cfg_(cfg),
      log_(std::move(log)),
      tls_(std::move(tls)),
      owner_(std::move(owner)),
      stop_wake_(ex, steady_clock::time_point::max()) {}

void connection_supervisor::add_static(const std::string& key) {
    static_keys_.insert(key);
    ensure(key, false);
}

// Completion of a supervisor task: an exception is a bug, never a reason to silently lose an nsqd
// connection. Log it and start the task again.
struct connection_supervisor::task_ended {
    std::weak_ptr<connection_supervisor> w;
    std::string key;
    bool discovered = false;
    void operator()(std::exception_ptr ep) const {
        if (!ep) return;
        auto self = w.lock();
        if (!self) return;
        self->log_.error("consumer task failed: restarting it",
                         {{"task", "nsqd supervisor"}, {"nsqd", key}, {"error", describe_exception(ep)}});
        ++self->restarts_;
        self->supervised_.erase(key);
        self->conns_.erase(key);
        self->changed();
        self->ensure(key, discovered);
    }
};

void connection_supervisor::ensure(const std::string& key, bool discovered) {
    if (stopping_ || supervised_.contains(key)) return;
    auto owner = owner_.lock();
    if (!owner) return;
    supervised_.insert(key);
    asio::co_spawn(ex_, supervise(shared_from_this(), std::move(owner), key, discovered),
                   task_ended{weak_from_this(), key, discovered});
}

void connection_supervisor::stop() {
    stopping_ = true;
    stop_wake_.cancel();
}

void connection_supervisor::abort_all() {
    for (auto& [k, c] : conns_) c->abort();
}

void connection_supervisor::changed() {
    if (auto o = owner_.lock()) o->on_supervision_changed();
}

// Connects to `key` again and again with exponential backoff until stopping, or — for an address found
// through lookupd — until the last poll no longer lists it.
asio::awaitable<void> connection_supervisor::supervise(std::shared_ptr<connection_supervisor> self,
                                                       std::shared_ptr<supervisor_owner> owner,
                                                       std::string key, bool discovered) {
    unsigned failures = 0;
    while (!self->stopping_) {
        if (discovered && !(self->poller_ && self->poller_->lists(key)) && !self->static_keys_.contains(key))
            break;
        bool was_subscribed = co_await self->connect_once(*owner, key);
        if (self->stopping_) break;
        failures = was_subscribed ? 1 : failures + 1;
        if (discovered && self->poller_) self->poller_->request_poll();
        auto delay =
            reconnect_delay(failures, self->cfg_.reconnect_backoff_min, self->cfg_.reconnect_backoff_max,
                            std::uniform_real_distribution<double>(0.0, 1.0)(self->rng_));
        self->log_.info("reconnecting", {{"nsqd", key}, {"in_ms", static_cast<std::int64_t>(delay.count())}});
        co_await net::with_timeout(self->stop_wake_.async_wait(), delay);
    }
    self->supervised_.erase(key);
    owner->on_supervision_changed();
}

// One connection's life. Returns whether it got as far as subscribing.
asio::awaitable<bool> connection_supervisor::connect_once(supervisor_owner& owner, const std::string& key) {
    auto hp = net::parse_host_port(key);
    if (!hp) co_return false;
    auto eps = co_await resolve_all(*hp, cfg_.connect_timeout, cfg_.resolver);
    if (!eps) {
        log_.warn("cannot resolve nsqd", {{"nsqd", key}, {"error", eps.err().message}});
        co_return false;
    }
    auto c = std::make_shared<connection>(ex_, key, cfg_, &owner, log_, tls_);
    conns_[key] = c;
    auto err = co_await c->run(std::move(*eps));
    bool was_subscribed = c->ever_subscribed();
    conns_.erase(key);
    owner.on_connection_ended(*c, was_subscribed);
    owner.on_supervision_changed();
    if (err) {
        log_.warn(was_subscribed ? "nsqd connection lost" : "nsqd connection failed",
                  {{"nsqd", key}, {"error", err.describe()}});
    } else {
        log_.info("nsqd connection closed", {{"nsqd", key}});
    }
    co_return was_subscribed;
}

}  // namespace cg::nsq
