// Shared pacing of Stripe calls between the sidecars of one ledger (stripe/rate_control.hpp says the law):
// every `consume` heartbeats a row per Stripe account it paces into stripe_pace_peers (migration 0019) —
// whether its demand reaches its admission, what it sent, the account's limit its law is at, how many 429
// episodes its own 429s started — and reads its peers' rows on the same accounts, in one statement. From
// those rows each pacer takes its share of the account's limit and either leads the law for the account
// (the first peer with a backlog, by peer id) or follows the leader's limit.
//
// Charging never waits on it: the exchange runs in its own loop, each step bounded (a pool connection
// within the interval, the statement within the expiry). A failed exchange, or one slower than the expiry,
// leaves every pacer alone (share 1, its own law) until one succeeds; a peer whose row is past its expiry
// (it stopped, or cannot reach PostgreSQL) is forgotten and its row deleted by the next exchange.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

namespace cg::billing {

class pace_peers {
  public:
    // `peer`: this process's id among its peers (pace_peers::random_id() for a running consume).
    pace_peers(std::shared_ptr<pg::pool> pool, std::string peer, std::chrono::milliseconds expiry,
               std::chrono::milliseconds acquire_within = std::chrono::milliseconds(250));

    // Heartbeats `mine` (rows live until now + expiry) and returns each of those accounts' live peers, by
    // peer id, this process among them; `throttled_since`: the peer's episodes rose since the last exchange
    // of this object read it. Runs on the pool's executor.
    net::awaitable<result<std::vector<stripe::client::pace_view>>> exchange(
        std::vector<stripe::client::pace_report> mine);
    // Deletes this process's rows (peers forget it at once rather than at its expiry).
    net::awaitable<result<void>> leave();

    const std::string& peer() const noexcept { return peer_; }
    static std::string random_id();

  private:
    std::shared_ptr<pg::pool> pool_;
    std::string peer_;
    std::chrono::milliseconds expiry_, acquire_within_;
    std::map<std::pair<std::string, std::string>, std::int64_t> seen_;  // (account, peer) → episodes
};

// For consume: every `interval`, the client's pacer reports → exchange → the pacers take the peers' view;
// started on `ex` (the pool's executor), stopped (its rows deleted) on the runtime's shutdown through the
// returned stop(). `client` must outlive the loop.
class pace_peers_loop {
  public:
    static std::shared_ptr<pace_peers_loop> start(asio::any_io_executor ex, std::shared_ptr<pg::pool> pool,
                                                  stripe::client& client, logger log,
                                                  std::chrono::milliseconds interval,
                                                  std::chrono::milliseconds expiry);
    ~pace_peers_loop();
    net::awaitable<void> stop();

    struct state;

  private:
    std::shared_ptr<state> st_;
};

}  // namespace cg::billing
