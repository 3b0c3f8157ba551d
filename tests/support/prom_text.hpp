// A strict reader of the Prometheus text format 0.0.4, for asserting on /metrics output.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cg::test {

struct prom_sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
};

struct prom_family {
    std::string name, type, help;
    std::vector<prom_sample> samples;
};

// Parses the whole text; throws std::runtime_error naming the line on any violation: a sample before its
// TYPE, a bad name, an unparsable value, histogram buckets that are not cumulative or lack +Inf, a
// _count that differs from the +Inf bucket.
std::map<std::string, prom_family> parse_prometheus(const std::string& text);

// Sum of a histogram's observations at or below `le` (the bucket's cumulative count).
double bucket_count(const prom_family& f, const std::string& le,
                    const std::map<std::string, std::string>& labels = {});

}  // namespace cg::test
