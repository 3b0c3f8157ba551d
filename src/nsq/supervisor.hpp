// The consumer's connection supervisor: one task per nsqd address that connects (every resolved address in
// turn), lets the connection serve (IDENTIFY, SUB, heartbeats and its watchdog are the connection's), and
// reconnects with exponential backoff until stopped — or, for an address found through lookupd, until the
// last poll no longer lists it. A task that throws is a bug: logged, counted and started again, so an nsqd
// is never silently lost. Knows nothing of RDY or handlers: connection events go to the owner.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ssl/context.hpp>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "core/log.hpp"
#include "net/tokens.hpp"
#include "nsq/config.hpp"
#include "nsq/connection.hpp"

namespace cg::nsq {

class lookupd_poller;

// The connection owner, plus what the supervisor reports about connections' lives.
class supervisor_owner : public connection_owner {
  public:
    // A connection's run() returned (after on_subscribed() when `was_subscribed`).
    virtual void on_connection_ended(connection& c, bool was_subscribed) = 0;
    // The set of connections or supervised addresses changed (drain waits on it).
    virtual void on_supervision_changed() = 0;
};

class connection_supervisor : public std::enable_shared_from_this<connection_supervisor> {
  public:
    // `cfg` must outlive the supervisor; `owner` is kept alive by each running task (weak otherwise).
    connection_supervisor(asio::any_io_executor ex, const consumer_config& cfg, logger log,
                          std::shared_ptr<asio::ssl::context> tls, std::weak_ptr<supervisor_owner> owner);

    // Discovery: asked whether a discovered address is still listed, and told when one dropped.
    // TLS towards nsqd (nullptr: plain); before the first ensure().
    void set_tls(std::shared_ptr<asio::ssl::context> tls) { tls_ = std::move(tls); }
    void set_poller(std::shared_ptr<lookupd_poller> p) { poller_ = std::move(p); }
    // An address given directly: supervised for ever (until stop()).
    void add_static(const std::string& key);
    // Starts a task for `key` unless one runs (no-op once stopping).
    void ensure(const std::string& key, bool discovered);
    // No more connects; sleeping reconnects wake up and end. Connections are left to the caller.
    void stop();
    // Closes every connection's socket now.
    void abort_all();

    const std::map<std::string, std::shared_ptr<connection>>& connections() const noexcept { return conns_; }
    bool all_closed() const noexcept { return conns_.empty() && supervised_.empty(); }
    std::uint64_t task_restarts() const noexcept { return restarts_; }

  private:
    struct task_ended;
    static asio::awaitable<void> supervise(std::shared_ptr<connection_supervisor> self,
                                           std::shared_ptr<supervisor_owner> owner, std::string key,
                                           bool discovered);
    asio::awaitable<bool> connect_once(supervisor_owner& owner, const std::string& key);
    void changed();

    asio::any_io_executor ex_;
    const consumer_config& cfg_;
    logger log_;
    std::shared_ptr<asio::ssl::context> tls_;
    std::weak_ptr<supervisor_owner> owner_;
    std::shared_ptr<lookupd_poller> poller_;
    std::map<std::string, std::shared_ptr<connection>> conns_;  // live (connecting or subscribed)
    std::set<std::string> supervised_;                          // keys with a task running
    std::set<std::string> static_keys_;
    net::steady_timer stop_wake_;
    bool stopping_ = false;
    std::uint64_t restarts_ = 0;
    std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace cg::nsq
