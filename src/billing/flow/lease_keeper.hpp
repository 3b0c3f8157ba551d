// Keeps a ledger lease alive while a Stripe call is awaited (docs/design.md §4 CHARGE, §4a MOVES): a timer
// beside the call runs one renewal every interval — the caller's, which touches the message and runs what
// the fsm's renewal() says (the lease extended, or, once it was found taken over, the call noted in flight)
// and hands the result to the fsm's renewed() — never two at once and none after the call returned. One
// mechanism for the charge path (charge_flow.cpp) and the corrections' money moves (corrections.cpp); what a
// renewal writes is theirs, and whether the lease is still held is the fsm's.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "billing/machine/charge_fsm.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "metrics/registry.hpp"
#include "net/tokens.hpp"

namespace cg::billing {

class lease_keeper : public std::enable_shared_from_this<lease_keeper> {
  public:
    // One renewal. It must not throw for database failures (a renewal that fails is retried at the next
    // interval). Whatever it refers to must outlive stop().
    using renew_fn = std::function<net::awaitable<void>()>;

    // Create with std::make_shared (the timer's handler holds the keeper too). Every handler runs on `ex`,
    // the executor the call is awaited on.
    lease_keeper(const asio::any_io_executor& ex, std::chrono::milliseconds interval, renew_fn renew,
                 logger log);

    // Arms the first renewal, `interval` from now.
    void start();
    // The call returned: no renewal starts any more; completes, on the keeper's executor, once a renewal
    // under way has ended (it may refer to the caller's frame).
    net::awaitable<void> stop();

  private:
    void arm();
    void ended();

    net::steady_timer timer_;   // the next renewal
    net::steady_timer joined_;  // cancelled when a renewal ends after the call returned
    std::chrono::milliseconds interval_;
    renew_fn renew_;
    logger log_;
    bool done_ = false;      // the call returned
    bool renewing_ = false;  // a renewal is under way
};

// What one renewal of a charge's or a correction's lease writes (its ledger's statements) and how it is
// told: one renewal (renew_once) for both.
struct lease_renewal {
    std::function<void()> touch;  // the message is alive (TOUCH); may be empty
    // Extends the lease held under the epoch it was last given: the new epoch, or nullopt when it was
    // taken over.
    std::function<net::awaitable<result<std::optional<std::int64_t>>>(std::int64_t epoch)> renew;
    // Once the lease was taken over: the call under the key generation given is still in flight.
    std::function<net::awaitable<result<void>>(std::int32_t generation)> note_in_flight;
    metrics::Counter* lost = nullptr;  // counts leases lost during a call; null counts nothing
    std::string_view row = "row";      // what the lease is on, for the log ("row", "revision")
};

// One renewal while a Stripe call is awaited, as the fsm's renewal() says: TOUCH, then the lease extended
// under the epoch the fsm holds — the result for the fsm's renewed(): the new epoch, or nullopt once found
// taken over (counted and logged, so the fsm asks only for in-flight notes from then on, and whoever holds
// the row now takes no new generation while this call can still move money) — or the call noted in flight
// (no result). A failed statement is logged and retried at the next interval (no result).
net::awaitable<std::optional<machine::in::renewed>> renew_once(const lease_renewal& how,
                                                               const machine::renew_command& what,
                                                               const logger& log);

}  // namespace cg::billing
