#include "app/cli.hpp"

#include <cctype>
#include <cmath>

#include "app/commands.hpp"

namespace cg::app {

// In the library, not main.cpp: every subcommand calls it, and the tests link the subcommands without main.
log_level global_flags::level() const {
    return parse_log_level(log_level).value_or(cg::log_level::info);
}

std::string env_name_for(const std::string& prefix, const std::string& long_flag) {
    std::string out = prefix;
    for (char c : long_flag)
        out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

void mirror_env(CLI::App& app, const std::string& prefix) {
    for (CLI::Option* opt : app.get_options()) {
        if (!opt->get_envname().empty() || opt->get_lnames().empty()) continue;
        const auto& name = opt->get_lnames().front();
        // --version prints and exits; --allow-insecure-http is a test-only switch that must be typed on the
        // command line, never inherited from an environment.
        if (name == "help" || name == "help-all" || name == "version" || name == "allow-insecure-http")
            continue;
        opt->envname(env_name_for(prefix, name));
    }
    for (CLI::App* sub : app.get_subcommands({})) mirror_env(*sub, prefix);
}

void add_runtime_flags(CLI::App& cmd, runtime_flags& f) {
    cmd.add_option("--health-listen", f.health_listen, "address for /healthz, /readyz, /metrics")
        ->capture_default_str();
    cmd.add_option("--offload-threads", f.offload_threads, "threads for blocking and Stripe work")
        ->check(CLI::Range(1u, 64u))
        ->capture_default_str();
    cmd.add_option("--shutdown-timeout", f.shutdown_timeout_s, "seconds to drain on SIGTERM before giving up")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
    cmd.add_option("--max-loop-lag", f.max_loop_lag_s, "seconds of event-loop lag above which /healthz fails")
        ->check(CLI::Range(0.001, 60.0))
        ->capture_default_str();
    cmd.add_option("--loop-lag-interval", f.loop_lag_interval_s,
                   "seconds between the event-loop lag probe's samples (chargeguard_event_loop_lag_seconds); "
                   "shorter gives a lag p99 from more samples, at one timer turn per sample")
        ->check(CLI::Range(0.001, 10.0))
        ->capture_default_str();
    cmd.add_option(
           "--loop-turn-budget", f.loop_turn_budget_s,
           "seconds a turn of the event loop runs deliveries' steps before the rest wait for the next "
           "turn, behind sockets and timers (bounds the loop's lag under load; 0 = unbounded)")
        ->check(CLI::Range(0.0, 0.1))
        ->capture_default_str();
}

namespace {
std::chrono::steady_clock::duration from_seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

runtime_options to_runtime_options(const runtime_flags& f) {
    runtime_options o;
    auto hp = net::parse_host_port(f.health_listen);
    if (!hp) throw CLI::ValidationError("--health-listen", hp.err().describe());
    o.health_listen = *hp;
    o.offload_threads = f.offload_threads;
    o.shutdown_timeout = from_seconds(f.shutdown_timeout_s);
    o.max_loop_lag = from_seconds(f.max_loop_lag_s);
    o.lag_interval = from_seconds(f.loop_lag_interval_s);
    o.turn_budget = std::chrono::microseconds(std::llround(f.loop_turn_budget_s * 1e6));
    return o;
}

logger make_stderr_logger(log_level level) {
    // Never a write(2) on the caller's thread: the event loop logs too (core/log.hpp async_fd_sink).
    return logger(std::make_shared<async_fd_sink>(2), level);
}

}  // namespace cg::app
