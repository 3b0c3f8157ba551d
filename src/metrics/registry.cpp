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

void registry::add_collectable(std::shared_ptr<const prometheus::Collectable> c) {
    std::lock_guard lock(extra_mu_);
    extra_.push_back(std::move(c));
}

std::string registry::render() const {
    auto fams = reg_->Collect();
    {
        std::lock_guard lock(extra_mu_);
        for (const auto& c : extra_) {
            auto more = c->Collect();
            fams.insert(fams.end(), std::make_move_iterator(more.begin()),
                        std::make_move_iterator(more.end()));
        }
    }
    prometheus::TextSerializer ser;
    return ser.Serialize(fams);
}

const prometheus::Histogram::BucketBoundaries& latency_buckets() {
    static const prometheus::Histogram::BucketBoundaries b{
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    return b;
}

}  // namespace cg::metrics
