#include "metrics/process.hpp"

#include <dirent.h>
#include <prometheus/metric_family.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace cg::metrics {
namespace {

std::string read_small_file(const char* path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The kernel's boot time (Unix seconds), from /proc/stat's "btime" line; read once per process.
double boot_time_seconds() {
    static const double btime = [] {
        std::istringstream in(read_small_file("/proc/stat"));
        std::string key;
        double v = 0;
        while (in >> key) {
            if (key == "btime") {
                in >> v;
                break;
            }
            in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
        }
        return v;
    }();
    return btime;
}

double count_open_fds() {
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return 0;
    double n = 0;
    while (auto* e = ::readdir(d))
        if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    return n - 1;  // the directory stream's own descriptor
}

prometheus::MetricFamily one(const char* name, const char* help, prometheus::MetricType type, double v) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    prometheus::ClientMetric m;
    if (type == prometheus::MetricType::Counter)
        m.counter.value = v;
    else
        m.gauge.value = v;
    f.metric.push_back(std::move(m));
    return f;
}

}  // namespace

std::optional<stat_fields> parse_proc_stat(const std::string& text) {
    auto close = text.rfind(')');
    if (close == std::string::npos) return std::nullopt;
    // After "pid (comm)": field 3 (state) onwards.
    std::istringstream in(text.substr(close + 1));
    std::string field;
    stat_fields out;
    for (int i = 3; i <= 22; ++i) {
        if (!(in >> field)) return std::nullopt;
        try {
            if (i == 14) out.utime = std::stoull(field);
            if (i == 15) out.stime = std::stoull(field);
            if (i == 22) out.starttime = std::stoull(field);
        } catch (const std::exception&) {
            return std::nullopt;
        }
    }
    return out;
}

std::optional<process_sample> read_process_sample() {
    auto st = parse_proc_stat(read_small_file("/proc/self/stat"));
    if (!st) return std::nullopt;
    const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
    process_sample s;
    s.cpu_seconds = static_cast<double>(st->utime + st->stime) / ticks;
    s.start_time_seconds = boot_time_seconds() + static_cast<double>(st->starttime) / ticks;
    // statm: size resident shared ... (pages)
    std::istringstream statm(read_small_file("/proc/self/statm"));
    double size_pages = 0, rss_pages = 0;
    statm >> size_pages >> rss_pages;
    s.resident_bytes = rss_pages * static_cast<double>(::sysconf(_SC_PAGESIZE));
    s.open_fds = count_open_fds();
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0)
        s.max_fds = rl.rlim_cur == RLIM_INFINITY ? -1 : static_cast<double>(rl.rlim_cur);
    return s;
}

std::vector<prometheus::MetricFamily> process_collector::Collect() const {
    auto s = read_process_sample();
    if (!s) return {};
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    out.push_back(one("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                      MetricType::Counter, s->cpu_seconds));
    out.push_back(one("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
                      s->resident_bytes));
    out.push_back(
        one("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, s->open_fds));
    out.push_back(
        one("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge, s->max_fds));
    out.push_back(one("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      MetricType::Gauge, s->start_time_seconds));
    return out;
}

}  // namespace cg::metrics
