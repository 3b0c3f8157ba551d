// The startup endpoint's state (/startupz): named conditions that must each have held once. Once all have,
// the process counts as started for the rest of its life, whatever its dependencies do later — so a
// Kubernetes startup probe on it waits for the first connections, and a dependency's later blip goes to
// /readyz, metrics and alerts instead of restarting or un-readying the pod.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/health.hpp"

namespace cg::metrics {

class startup {
  public:
    using condition = std::function<bool()>;

    // A condition met once mark(name) is called; `waiting` says what it waits for (no hosts or secrets:
    // it is served to anyone who can reach the health listener).
    void require(std::string name, std::string waiting);
    // A condition polled on each report() until it holds once: `met` must read a fact that stays true
    // once true (e.g. "subscribed at least once"), cheaply and without I/O, on the reporting thread.
    void require(std::string name, std::string waiting, condition met);
    // Marks a condition met (unknown names are ignored). Thread-safe.
    void mark(std::string_view name);
    // Changes what a pending condition says it waits for.
    void waiting_for(std::string_view name, std::string waiting);

    // ok once every condition has held (then forever). With no conditions registered: ok.
    // Body: one line per condition, "ok name" or "WAIT name: what it waits for".
    health_report report();
    bool started();

  private:
    struct item {
        std::string name, waiting;
        condition met;  // empty: only mark() meets it
        bool done = false;
    };
    std::mutex mu_;
    std::vector<item> items_;
    bool latched_ = false;
};

}  // namespace cg::metrics
