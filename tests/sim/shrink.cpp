// Shrinking a failing schedule: its faults are numbered in the order they fired; keeping a subset of them
// (config::keep_faults) is another schedule of the same seed, which replays bit for bit. The shrinker drops
// halves, then quarters… then single faults, keeping each removal after which the run still breaks an
// invariant, until no single fault can go (or the budget of runs is spent).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "sim.hpp"

namespace cg::sim {

shrunk shrink(const config& failing, const std::function<run_result(const config&)>& run_fn, int max_runs) {
    shrunk out;
    config c = failing;
    c.trace = false;
    c.keep_faults.reset();
    const run_result first = run_fn(c);
    out.runs = 1;
    out.original = first.faults;
    if (first.violations.empty()) return out;
    std::vector<std::uint32_t> kept(first.faults);
    std::iota(kept.begin(), kept.end(), 1u);
    if (failing.keep_faults) kept = *failing.keep_faults;
    auto fails = [&](const std::vector<std::uint32_t>& cand) {
        c.keep_faults = cand;
        ++out.runs;
        return !run_fn(c).violations.empty();
    };
    std::size_t chunk = std::max<std::size_t>(1, kept.size() / 2);
    while (out.runs < max_runs) {
        bool removed = false;
        for (std::size_t i = 0; i < kept.size() && out.runs < max_runs;) {
            std::vector<std::uint32_t> cand(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(i));
            cand.insert(cand.end(),
                        kept.begin() + static_cast<std::ptrdiff_t>(std::min(i + chunk, kept.size())),
                        kept.end());
            if (fails(cand)) {
                kept = std::move(cand);
                removed = true;
            } else {
                i += chunk;
            }
        }
        if (!removed && chunk == 1) break;
        if (!removed) chunk = std::max<std::size_t>(1, chunk / 2);
    }
    out.kept = kept;
    c.keep_faults = kept;
    c.trace = true;
    out.result = run_fn(c);
    ++out.runs;
    // The faults the shrunk run kept, each with the step it caused; then its violations.
    const auto& s = out.result.schedule;
    for (std::size_t i = 0; i < s.size(); ++i)
        if (s[i].find(" fault #") != std::string::npos)
            out.schedule.push_back(s[i] + (i + 1 < s.size() ? " -> " + s[i + 1] : std::string()));
    return out;
}

}  // namespace cg::sim
