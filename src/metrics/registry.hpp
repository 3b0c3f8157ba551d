// Metrics registry on prometheus-cpp's core (counters, gauges, histograms with labels) and the
// Prometheus text exposition format 0.0.4. Thread-safe: metrics may be updated from any executor.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cg::metrics {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
template <typename T>
using family = prometheus::Family<T>;
using labels = prometheus::Labels;

class registry {
  public:
    registry();

    // Families are created once per name; asking again returns the same family.
    family<Counter>& counter(const std::string& name, const std::string& help);
    family<Gauge>& gauge(const std::string& name, const std::string& help);
    family<Histogram>& histogram(const std::string& name, const std::string& help);

    // Families computed at scrape time (e.g. metrics::process_collector), appended to every render().
    void add_collectable(std::shared_ptr<const prometheus::Collectable> c);

    // Text format 0.0.4.
    std::string render() const;
    static constexpr const char* content_type = "text/plain; version=0.0.4; charset=utf-8";

    prometheus::Registry& raw() { return *reg_; }

  private:
    std::shared_ptr<prometheus::Registry> reg_;
    mutable std::mutex extra_mu_;
    std::vector<std::shared_ptr<const prometheus::Collectable>> extra_;
};

// Bucket boundaries for latencies measured in seconds, 100 µs .. 10 s.
const prometheus::Histogram::BucketBoundaries& latency_buckets();

}  // namespace cg::metrics
