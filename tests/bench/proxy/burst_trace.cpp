// vault_proxy bench, --trace-burst: where the time of a synchronised burst of requests goes, per stage, from
// the proxy's "vault request stages" debug lines.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <utility>

#include "tests/bench/proxy/vault_proxy.hpp"

namespace vault_bench {

// --trace-burst: the proxy's per-request stage lines (debug) of the measured run, grouped into bursts (a gap
// of more than 5 ms between two arrivals starts a new one); prints each stage's p50 / p99 over every request
// and the timeline of the largest burst of the run's second half.
void print_burst_trace(const std::string& log, clock_type::time_point from) {
    struct rec {
        std::map<std::string, double> v;
    };
    std::vector<rec> recs;
    auto since = static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(from.time_since_epoch()).count());
    std::istringstream in(log);
    std::string line;
    std::regex field(R"re("([a-z_]+)":(-?[0-9.]+))re");
    while (std::getline(in, line)) {
        if (line.find("vault request stages") == std::string::npos) continue;
        rec r;
        for (std::sregex_iterator it(line.begin(), line.end(), field), end; it != end; ++it)
            r.v[(*it)[1].str()] = std::atof((*it)[2].str().c_str());
        if (r.v["t_us"] >= since) recs.push_back(std::move(r));
    }
    if (recs.empty()) {
        std::printf("trace: no stage lines in the proxy's log\n");
        return;
    }
    std::sort(recs.begin(), recs.end(),
              [](const rec& a, const rec& b) { return a.v.at("t_us") < b.v.at("t_us"); });
    const char* stages[] = {"auth_us",     "parse_us",  "wait_us",  "stmt_us", "to_upstream_us",
                            "upstream_us", "answer_us", "total_us", "batch",   "settlements"};
    std::printf("trace: %zu forwarded creates; per stage p50 / p99 (µs), from the proxy's own clock:\n",
                recs.size());
    for (const char* s : stages) {
        std::vector<double> v;
        for (auto& r : recs) v.push_back(r.v[s]);
        std::printf("  %-15s %8.0f %8.0f\n", s, pct(v, 0.5), pct(v, 0.99));
    }
    std::vector<std::pair<std::size_t, std::size_t>> bursts;  // [begin, end)
    std::size_t b = 0;
    for (std::size_t i = 1; i <= recs.size(); ++i)
        if (i == recs.size() || recs[i].v["t_us"] - recs[i - 1].v["t_us"] > 5000) {
            bursts.emplace_back(b, i);
            b = i;
        }
    std::vector<double> spans, sizes;
    for (auto [lo, hi] : bursts) {
        sizes.push_back(static_cast<double>(hi - lo));
        spans.push_back(recs[hi - 1].v["t_us"] - recs[lo].v["t_us"]);
    }
    std::printf(
        "trace: %zu bursts; requests per burst p50 %.0f; arrival spread within a burst p50 %.0f µs, p99 %.0f "
        "µs\n",
        bursts.size(), pct(sizes, 0.5), pct(spans, 0.5), pct(spans, 0.99));
    // The largest burst of the second half of the run (the first half has the warm-up and the direct runs'
    // neighbours): where a synchronised burst's time goes.
    std::size_t pick = bursts.size() / 2;
    for (std::size_t i = bursts.size() / 2; i < bursts.size(); ++i)
        if (bursts[i].second - bursts[i].first > bursts[pick].second - bursts[pick].first) pick = i;
    auto [lo, hi] = bursts[pick];
    double t0 = recs[lo].v["t_us"];
    std::printf(
        "trace: one burst (the largest of the run's second half), µs; arrival = offset from its first "
        "request\n");
    std::printf("  %8s %6s %6s %6s %6s %5s %5s %7s %8s %6s %7s\n", "arrival", "auth", "parse", "wait", "stmt",
                "batch", "settl", "to_up", "upstream", "answer", "total");
    for (std::size_t i = lo; i < hi; ++i) {
        auto& v = recs[i].v;
        std::printf("  %8.0f %6.0f %6.0f %6.0f %6.0f %5.0f %5.0f %7.0f %8.0f %6.0f %7.0f\n", v["t_us"] - t0,
                    v["auth_us"], v["parse_us"], v["wait_us"], v["stmt_us"], v["batch"], v["settlements"],
                    v["to_upstream_us"], v["upstream_us"], v["answer_us"], v["total_us"]);
    }
}

}  // namespace vault_bench
