#include "metrics/registry.hpp"

#include <prometheus/text_serializer.h>

namespace cg::metrics {

registry::registry()
    : reg_(std::make_shared<prometheus::Registry>(prometheus::Registry::InsertBehavior::Merge)) {}

family<Counter>& registry::counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(*reg_);
}

family<Gauge>& registry::gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(*reg_);
}

family<Histogram>& registry::histogram(const std::string& name, const std::string& help) {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(*reg_);
}

std::string registry::render() const {
    prometheus::TextSerializer ser;
    return ser.Serialize(reg_->Collect());
}

const prometheus::Histogram::BucketBoundaries& latency_buckets() {
    static const prometheus::Histogram::BucketBoundaries b{
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    return b;
}

}  // namespace cg::metrics
