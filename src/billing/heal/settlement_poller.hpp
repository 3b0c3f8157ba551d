// No webhook, no problem: rows still `processing` after --processing-poll-after are retrieved from Stripe by
// id (GET /v1/payment_intents/{id}, or /v1/charges/{id} for a charge left pending; never a search) at a
// bounded rate, and what Stripe says goes through the same step as a webhook (settlement.hpp,
// settlement_store.hpp). A lost or misconfigured webhook therefore never leaves a row open for longer than
// the bound plus one pass. Each pass also applies the events recorded while their row was pending that the
// pipeline has not applied (the row settled charged or declined without passing through processing).
//
// Runs on the main loop (the pool's executor); the Stripe client's calls complete there. The pool, the
// client and the registry must outlive the poller.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <cstdint>
#include <memory>

#include "billing/machine/request_pacer.hpp"
#include "billing/store/settlement_store.hpp"
#include "core/log.hpp"
#include "net/stoppable_task.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::stripe {
class client;
}
namespace cg::metrics {
class registry;
}

namespace cg::billing {

struct poller_config {
    std::chrono::milliseconds poll_after{std::chrono::hours(1)};  // --processing-poll-after
    double rate_per_second = 5;                                   // --processing-poll-rate: retrieves/s
    std::int64_t batch = 100;                                     // rows read per pass
    std::chrono::milliseconds interval{std::chrono::minutes(1)};  // between passes
    std::chrono::milliseconds deferred_after{std::chrono::minutes(1)};
};

struct poll_report {
    std::size_t due = 0;        // rows processing past the bound
    std::size_t retrieved = 0;  // answered by Stripe
    std::size_t settled = 0;    // left processing (charged or failed_after_processing)
    std::size_t failed = 0;     // of those, failed after processing
    std::size_t errors = 0;     // Stripe or PostgreSQL errors (the row is polled again next pass)
    std::size_t deferred_rows = 0;
};

class settlement_poller {
  public:
    settlement_poller(poller_config cfg, std::shared_ptr<pg::pool> pool, stripe::client& stripe, logger log,
                      metrics::registry* reg = nullptr);
    ~settlement_poller();

    // One pass: the due rows (at most `batch`), each retrieved and applied, at most rate_per_second
    // retrieves per second; then the deferred events. Fails only when the due rows cannot be read.
    net::awaitable<result<poll_report>> poll_once();
    // Passes every `interval` on `ex` (the first after one interval: the schema gate and --migrate run at
    // startup meanwhile) until stop(); `self` (this poller) is kept alive until the loop has ended.
    void start(asio::any_io_executor ex, std::shared_ptr<settlement_poller> self);
    // Ends the passes; completes once a pass in progress has ended (between two rows).
    net::awaitable<void> stop();

  private:
    struct metrics_set;
    net::awaitable<void> pace();
    net::awaitable<bool> pass();

    poller_config cfg_;
    std::shared_ptr<pg::pool> pool_;
    settlement_store store_;
    stripe::client& stripe_;
    logger log_;
    std::unique_ptr<metrics_set> metrics_;
    request_pacer pacer_;
    metrics::registry* reg_ = nullptr;
    net::stoppable_task task_;
};

}  // namespace cg::billing
