// `chargeguard dead-letters replay` (cmd_dead_letters.cpp registers it): the ledger row each replayed event
// would meet, checked and reopened as the money machine's replay decision says (machine::on_replay), then
// the body published and the letter marked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/pg_flags.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::nsq {
class producer;
}

namespace cg::app {

struct letters_replay_flags {
    pg_flags pg;
    std::vector<std::int64_t> ids;
    std::string reason;
    std::string nsqd_tcp_address;
    std::string topic;  // empty: each letter's own topic
    std::string by;
    bool force = false;
    bool no_validate = false;
    std::string event_file;  // a corrected event to publish instead of the stored body (one letter)
    std::string event;       // its contents
};

// Replays the letters `f` names (ids, or every open one of a reason) through `producer`; the exit code.
net::awaitable<int> run_replay(letters_replay_flags f, std::shared_ptr<pg::pool> pool,
                               nsq::producer* producer);

}  // namespace cg::app
