// CPU time and peak RSS of this process, for benchmarks' figures.
#pragma once

#include <sys/resource.h>

namespace cg::test {

// User + system CPU seconds used so far by this process.
inline double cpu_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Peak resident set size so far, in KiB (Linux reports ru_maxrss in KiB).
inline long peak_rss_kib() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

}  // namespace cg::test
