#include "metrics/startup.hpp"

#include <algorithm>

namespace cg::metrics {

void startup::require(std::string name, std::string waiting) {
    require(std::move(name), std::move(waiting), {});
}

void startup::require(std::string name, std::string waiting, condition met) {
    std::lock_guard lock(mu_);
    if (latched_) return;  // a condition added after startup completed cannot un-start the process
    items_.push_back({std::move(name), std::move(waiting), std::move(met), false});
}

void startup::mark(std::string_view name) {
    std::lock_guard lock(mu_);
    for (auto& i : items_)
        if (i.name == name) i.done = true;
}

void startup::waiting_for(std::string_view name, std::string waiting) {
    std::lock_guard lock(mu_);
    for (auto& i : items_)
        if (i.name == name) i.waiting = waiting;
}

health_report startup::report() {
    std::lock_guard lock(mu_);
    if (latched_) return {true, "ok started\n"};
    health_report r;
    for (auto& i : items_) {
        if (!i.done && i.met && i.met()) i.done = true;
        r.ok = r.ok && i.done;
        r.body += i.done ? "ok " + i.name + "\n" : "WAIT " + i.name + ": " + i.waiting + "\n";
    }
    if (r.ok) {
        latched_ = true;
        items_.clear();  // the conditions' callables may refer to components that shut down later
        r.body = "ok started\n";
    }
    return r;
}

bool startup::started() {
    return report().ok;
}

}  // namespace cg::metrics
