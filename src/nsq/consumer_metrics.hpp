// The NSQ consumer's series, labelled with its topic and channel (docs/operating/metrics.md). The consumer
// adds the per-message counts once per read batch and whenever a worker runs out of work.
#pragma once

#include <string>

#include "metrics/registry.hpp"

namespace cg::nsq {

struct consumer_metrics {
    consumer_metrics(metrics::registry& reg, const std::string& topic, const std::string& channel);

    metrics::Counter *received, *finished, *requeued, *gave_up, *fin_failed, *touches, *handler_errors,
        *dropped;
    metrics::Gauge *connections, *rdy, *handlers;
};

}  // namespace cg::nsq
