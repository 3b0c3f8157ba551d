// chargeguard_nsq_channel_depth{topic,channel,nsqd}: the consume's view of its channel's depth at each nsqd,
// read from nsqd's HTTP `/stats?format=json&topic=T&channel=C` (the channel's `depth`: queued in memory and
// on disk, not in flight) on a slow timer. The nsqds are those nsqlookupd's /lookup lists for the topic
// (each producer's broadcast_address and http_port, asked afresh every round) and those given directly
// with their HTTP address. Everything is asynchronous on the given executor (nsq::http_get: asynchronous
// resolve, connect, read; each exchange bounded by `timeout`): the event loop never waits for nsqd. An nsqd
// that does not answer, or no longer lists the channel, or that lookupd no longer lists, loses its series
// (a stale depth would read as a backlog that is not there); the failure is logged at warn once per nsqd
// until it answers again.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "net/tokens.hpp"

namespace cg::nsq {

struct channel_depth_config {
    std::string topic, channel;
    std::vector<std::string> lookupd_http_addresses;  // "host:port" or "http://host:port"
    std::vector<std::string> nsqd_http_addresses;     // "host:port": nsqds given directly
    std::chrono::milliseconds interval{30000};        // between rounds (the first one at once)
    std::chrono::milliseconds timeout{5000};          // one HTTP exchange
};

class channel_depth_monitor : public std::enable_shared_from_this<channel_depth_monitor> {
  public:
    channel_depth_monitor(asio::any_io_executor ex, channel_depth_config cfg, metrics::registry& reg,
                          logger log);
    // Starts the rounds in the background. Call once; the registry must outlive the monitor.
    void start();
    // Ends the rounds: no series is touched after it returns.
    void stop();
    std::uint64_t rounds() const { return rounds_; }

  private:
    asio::awaitable<bool> pass();
    asio::awaitable<void> round();
    asio::awaitable<std::set<std::string>> nsqds();

    asio::any_io_executor ex_;
    channel_depth_config cfg_;
    metrics::family<metrics::Gauge>& depth_;
    logger log_;
    std::map<std::string, metrics::Gauge*> series_;  // by nsqd HTTP address
    std::set<std::string> failing_;                  // nsqds whose failure was logged
    net::stoppable_task task_;
    std::uint64_t rounds_ = 0;
};

}  // namespace cg::nsq
