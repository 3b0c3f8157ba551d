// Metrics of one pool and its connections (thread-safe: prometheus-cpp metrics are atomic).
#pragma once

#include <string>
#include <system_error>

#include "metrics/registry.hpp"

namespace cg::pg {

class stats {
  public:
    // Registers (or finds) the families on `reg`, labelled pool=`pool_name`. `reg` must outlive this.
    stats(metrics::registry& reg, const std::string& pool_name, std::size_t pool_size);

    // One statement or batch finished after `seconds`, with `ec` (empty on success).
    void query_done(double seconds, const std::error_code& ec);
    // An error outside a query (connect, acquire), counted by class.
    void error(const std::error_code& ec);
    void connect_done(bool ok);

    metrics::Gauge& size;                // configured connections
    metrics::Gauge& open;                // connected (idle + in use)
    metrics::Gauge& in_use;              // handed out to callers
    metrics::Gauge& up;                  // 1 while PostgreSQL answers, as last seen by the pool
    metrics::Counter& waits;             // acquisitions that had to wait for a connection to come back
    metrics::Counter& acquire_failures;  // acquisitions that ended in errc::unavailable
    metrics::Counter& failovers;         // new connections that reached another server (pool::on_failover)

  private:
    metrics::registry& reg_;
    std::string pool_;
    metrics::Histogram& latency_;
    metrics::Counter& connects_ok_;
    metrics::Counter& connects_failed_;
};

}  // namespace cg::pg
