// Process metrics in the names Prometheus client libraries share (process_cpu_seconds_total,
// process_resident_memory_bytes, process_open_fds, process_max_fds, process_start_time_seconds), read from
// /proc/self when /metrics is scraped. Linux only; elsewhere the families are left out.
#pragma once

#include <prometheus/collectable.h>

#include <optional>
#include <string>
#include <vector>

namespace cg::metrics {

struct process_sample {
    double cpu_seconds = 0;         // user + system time
    double resident_bytes = 0;      // RSS
    double open_fds = 0;            // entries of /proc/self/fd
    double max_fds = 0;             // RLIMIT_NOFILE soft limit
    double start_time_seconds = 0;  // since the Unix epoch
};

// One reading of /proc/self (a few small procfs reads, no disk I/O). nullopt when /proc is unavailable.
std::optional<process_sample> read_process_sample();

// Parses the fields of /proc/self/stat the sample needs: utime and stime (fields 14, 15) and starttime
// (field 22), in clock ticks. The command name (field 2) may hold spaces and parentheses: parsing starts
// after its last ')'. nullopt when the text is malformed.
struct stat_fields {
    unsigned long long utime = 0, stime = 0, starttime = 0;
};
std::optional<stat_fields> parse_proc_stat(const std::string& text);

// A Collectable for the process families; registry::render() appends what it returns.
class process_collector final : public prometheus::Collectable {
  public:
    std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace cg::metrics
