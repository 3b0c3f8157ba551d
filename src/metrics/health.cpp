#include "metrics/health.hpp"

namespace cg::metrics {

void health::add_liveness(std::string name, check c) {
    std::lock_guard lock(mu_);
    live_.emplace_back(std::move(name), std::move(c));
}

void health::add_readiness(std::string name, check c) {
    std::lock_guard lock(mu_);
    ready_.emplace_back(std::move(name), std::move(c));
}

health_report health::run(const std::vector<std::pair<std::string, check>>& checks, bool redact) {
    health_report r;
    for (const auto& [name, c] : checks) {
        auto s = c();
        r.ok = r.ok && s.ok;
        r.body += s.ok ? "ok " : "FAIL ";
        r.body += name;
        const auto& detail = redact ? s.public_detail : s.detail;
        if (!detail.empty()) {
            r.body += ": ";
            r.body += detail;
        }
        r.body += '\n';
    }
    return r;
}

health_report health::live() const {
    std::lock_guard lock(mu_);
    return run(live_, false);
}

health_report health::ready(bool ready_when_empty, bool redact) const {
    std::lock_guard lock(mu_);
    if (ready_.empty())
        return {ready_when_empty,
                ready_when_empty ? "ok (no checks)\n" : "FAIL no readiness checks registered\n"};
    return run(ready_, redact);
}

}  // namespace cg::metrics
