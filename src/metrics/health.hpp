// Liveness and readiness checks. Checks are cheap synchronous reads of state the components keep
// current (they never do I/O), so a health request never waits on a dependency.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace cg::metrics {

struct check_status {
    check_status() = default;
    check_status(bool ok_, std::string detail_, std::string public_detail_ = {})
        : ok(ok_), detail(std::move(detail_)), public_detail(std::move(public_detail_)) {}

    bool ok = true;
    std::string detail;
    // What may be shown to anyone who reaches the health listener (no hosts, ports, users or secrets);
    // a redacted report shows this instead of `detail` (empty: the check's name only).
    std::string public_detail;
};

struct health_report {
    bool ok = true;
    std::string body;  // one line per check: "ok name: detail" / "FAIL name: detail"
};

class health {
  public:
    using check = std::function<check_status()>;

    void add_liveness(std::string name, check c);
    void add_readiness(std::string name, check c);

    health_report live() const;
    // Not ready when any readiness check fails, or when nothing registered any (not yet wired up)...
    // unless `ready_when_empty` is set for processes with no dependencies. `redact`: each line shows the
    // check's public_detail instead of its detail (a listener reachable beyond this host).
    health_report ready(bool ready_when_empty = false, bool redact = false) const;

  private:
    static health_report run(const std::vector<std::pair<std::string, check>>& checks, bool redact);
    mutable std::mutex mu_;
    std::vector<std::pair<std::string, check>> live_, ready_;
};

}  // namespace cg::metrics
