// Helpers for the pipeline tests: reading a metric family of a registry.
#pragma once

#include <string>

#include "metrics/registry.hpp"
#include "support/prom_text.hpp"

namespace cg::test {

// The value of `family`, a metric without labels (-1 when it is missing or has other than one sample).
inline double unlabelled(metrics::registry& reg, const std::string& family) {
    auto fams = parse_prometheus(reg.render());
    auto it = fams.find(family);
    if (it == fams.end() || it->second.samples.size() != 1) return -1;
    return it->second.samples[0].value;
}

}  // namespace cg::test
