// Discovery through nsqlookupd: the union of /lookup?topic= over every lookupd, polled with jitter (go-nsq:
// every 60 s, jitter 0.3), and sooner when a consumer connection to a discovered nsqd drops. The consumer
// is told each answered poll's list; a poll no lookupd answered keeps the previous list (lookupd being
// down is not nsqd being down). Runs on one executor.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "core/log.hpp"
#include "net/tokens.hpp"
#include "nsq/config.hpp"

namespace cg::nsq {

class lookupd_poller : public std::enable_shared_from_this<lookupd_poller> {
  public:
    // Called after every poll some lookupd answered, with the nsqd keys ("broadcast_address:tcp_port").
    using listed_fn = std::function<void(const std::set<std::string>&)>;

    // `cfg` must outlive the poller (the consumer's configuration).
    lookupd_poller(asio::any_io_executor ex, const consumer_config& cfg, logger log, listed_fn on_listed);

    // Starts polling in the background (a poll at once). A failure of the polling task is logged and the
    // task started again. Call once.
    void start();
    // A discovered nsqd dropped: poll again soon (at most every reconnect_backoff_min).
    void request_poll();
    // Ends the polling; no callback after it returns.
    void stop();
    // Whether the last answered poll listed `key`.
    bool lists(const std::string& key) const { return listed_.contains(key); }
    std::uint64_t task_restarts() const { return restarts_; }

  private:
    static asio::awaitable<void> loop(std::shared_ptr<lookupd_poller> self);
    asio::awaitable<void> query();
    void spawn();

    asio::any_io_executor ex_;
    const consumer_config& cfg_;
    logger log_;
    listed_fn on_listed_;
    std::set<std::string> listed_;
    net::steady_timer wake_, stop_wake_;
    bool requested_ = false, stopped_ = false;
    std::uint64_t restarts_ = 0;
    std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace cg::nsq
