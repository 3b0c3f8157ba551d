#include "nsq/lookupd_poller.hpp"

#include <asio/co_spawn.hpp>

#include "http/proto/message.hpp"
#include "net/address.hpp"
#include "net/timeout.hpp"
#include "nsq/http_get.hpp"
#include "nsq/proto/lookup.hpp"
#include "nsq/task.hpp"

namespace cg::nsq {

using namespace std::chrono;
using sclock = steady_clock;

lookupd_poller::lookupd_poller(asio::any_io_executor ex, const consumer_config& cfg, logger log,
                               listed_fn on_listed)
    : ex_(ex),
      cfg_(cfg),
      log_(std::move(log)),
      on_listed_(std::move(on_listed)),
      wake_(ex, sclock::time_point::max()),
      stop_wake_(ex, sclock::time_point::max()) {}

void lookupd_poller::start() {
    spawn();
}

void lookupd_poller::spawn() {
    asio::co_spawn(ex_, loop(shared_from_this()), [w = weak_from_this()](std::exception_ptr ep) {
        if (!ep) return;
        auto self = w.lock();
        if (!self || self->stopped_) return;
        self->log_.error("lookupd poller failed: restarting it", {{"error", describe_exception(ep)}});
        ++self->restarts_;
        self->spawn();
    });
}

void lookupd_poller::request_poll() {
    requested_ = true;
    wake_.cancel();
}

void lookupd_poller::stop() {
    stopped_ = true;
    wake_.cancel();
    stop_wake_.cancel();
}

asio::awaitable<void> lookupd_poller::loop(std::shared_ptr<lookupd_poller> self) {
    while (!self->stopped_) {
        self->requested_ = false;
        co_await self->query();
        if (self->stopped_) break;
        if (self->requested_) {
            // A disconnect asked for a fresh look; don't hammer lookupd while an nsqd is down.
            co_await net::with_timeout(self->stop_wake_.async_wait(), self->cfg_.reconnect_backoff_min);
            continue;
        }
        auto unit = std::uniform_real_distribution<double>(0.0, 1.0)(self->rng_);
        auto base = duration<double, std::milli>(self->cfg_.lookupd_poll_interval);
        auto wait = base * (1.0 + self->cfg_.lookupd_poll_jitter * (unit - 0.5));
        co_await net::with_timeout(self->wake_.async_wait(), duration_cast<sclock::duration>(wait));
    }
}

asio::awaitable<void> lookupd_poller::query() {
    std::set<std::string> found;
    bool any_answer = false;
    for (const auto& addr : cfg_.lookupd_http_addresses) {
        std::string a = addr.rfind("http://", 0) == 0 ? addr.substr(7) : addr;
        if (auto slash = a.find('/'); slash != std::string::npos) a.resize(slash);
        auto hp = net::parse_host_port(a);
        if (!hp) continue;
        auto r = co_await http_get(*hp, "/lookup?topic=" + http::url_encode(cfg_.topic),
                                   "application/vnd.nsq; version=1.0", cfg_.lookupd_timeout);
        if (stopped_) co_return;
        if (!r) {
            log_.warn("nsqlookupd query failed", {{"lookupd", addr}, {"error", r.err().describe()}});
            continue;
        }
        if (r->status == 404) {  // topic not (yet) known to this lookupd
            any_answer = true;
            continue;
        }
        if (r->status != 200) {
            log_.warn("nsqlookupd answered an error", {{"lookupd", addr}, {"status", r->status}});
            continue;
        }
        auto producers = proto::parse_lookup_response(r->body);
        if (!producers) {
            log_.warn("nsqlookupd reply unusable",
                      {{"lookupd", addr}, {"error", producers.err().describe()}});
            continue;
        }
        any_answer = true;
        for (const auto& p : *producers) found.insert(p.key());
    }
    if (!any_answer) co_return;  // keep what we had: lookupd being down is not nsqd being down
    listed_ = std::move(found);
    on_listed_(listed_);
}

}  // namespace cg::nsq
