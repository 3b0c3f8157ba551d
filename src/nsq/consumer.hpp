// The NSQ consumer: connections to nsqd (given directly and/or discovered through nsqlookupd), RDY
// distribution within max_in_flight, go-nsq's handler-failure backoff, reconnects, max_attempts →
// give-up, and a graceful drain. Everything runs on one executor (the main io_context).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <cstdint>
#include <memory>

#include "core/log.hpp"
#include "core/result.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "nsq/config.hpp"
#include "nsq/message.hpp"

namespace cg::nsq {

struct consumer_stats {
    std::uint64_t received = 0;
    std::uint64_t finished = 0;
    std::uint64_t requeued = 0;
    std::uint64_t gave_up = 0;         // passed to the give-up handler (then FINed)
    std::uint64_t handler_errors = 0;  // handler threw
    std::uint64_t fin_failed = 0;      // E_FIN_FAILED: the message had timed out at nsqd
    std::uint64_t req_failed = 0;
    std::uint64_t touch_failed = 0;
    std::uint64_t touches = 0;
    std::uint64_t responses_dropped = 0;  // FIN/REQ for a message whose connection had closed
    std::uint64_t dropped = 0;            // deliveries dropped unhandled: their connection had closed
    std::uint64_t max_outstanding = 0;    // most deliveries received and not yet handled (queued + running)
    std::uint64_t connects = 0;           // successful subscriptions, over the lifetime
    std::uint64_t lookups_answered = 0;   // lookupd polls some nsqlookupd answered (a 404 topic included)
    std::uint64_t disconnects = 0;
    std::uint64_t connections = 0;    // subscribed now
    std::uint64_t total_rdy = 0;      // sum of RDY sent now
    std::uint64_t max_total_rdy = 0;  // the largest sum ever committed
    std::uint64_t max_handlers = 0;   // most handlers running at once
    std::uint64_t task_restarts = 0;  // background tasks (supervisor, poller, rotation) restarted after a bug
};

class consumer {
  public:
    // `reg` must outlive the consumer (metrics are registered on it, labelled topic/channel).
    consumer(asio::any_io_executor ex, consumer_config cfg, message_handler handler, logger log,
             metrics::registry& reg);
    // Aborts connections without draining (call stop() first for a graceful end).
    ~consumer();
    consumer(const consumer&) = delete;
    consumer& operator=(const consumer&) = delete;

    // go-nsq's default logs and FINs; the billing layer dead-letters. Set before start().
    void set_give_up_handler(give_up_handler h);
    // Registers readiness check "nsq": ready while at least one connection is subscribed.
    // `h` keeps a reference to shared state, so it may outlive the consumer.
    void add_readiness(metrics::health& h);

    // Validates the configuration (bad_config, before any connection) and starts connecting and
    // polling in the background. Call once, on the consumer's executor.
    result<void> start();

    // Graceful drain: RDY 0 everywhere, wait for running handlers (≤ drain_timeout), CLS, wait for
    // CLOSE_WAIT and for the last FINs to be written, close. Completes on the consumer's executor once
    // every connection is closed; cancel by destroying the consumer. Idempotent.
    asio::awaitable<void> stop();

    const consumer_stats& stats() const;
    std::size_t subscribed_connections() const;
    const consumer_config& config() const;

    struct core;

  private:
    std::shared_ptr<core> core_;
};

}  // namespace cg::nsq
