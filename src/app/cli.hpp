// CLI helpers shared by subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "app/runtime.hpp"
#include "core/log.hpp"

namespace cg::app {

// Gives every long option of `app` and its subcommands (recursively) an environment variable
// CHARGEGUARD_<SUBCOMMAND?>_<FLAG> … precisely: CHARGEGUARD_<FLAG_IN_UPPER_SNAKE>, unless one is set.
void mirror_env(CLI::App& app, const std::string& prefix = "CHARGEGUARD_");
std::string env_name_for(const std::string& prefix, const std::string& long_flag);

// Options every long-running subcommand shares (--health-listen, --offload-threads, …).
struct runtime_flags {
    std::string health_listen = "127.0.0.1:9180";
    unsigned offload_threads = 2;
    double shutdown_timeout_s = 30;
    double max_loop_lag_s = 0.2;
    double loop_lag_interval_s = 0.05;
    double loop_turn_budget_s = 0.0005;
};
void add_runtime_flags(CLI::App& cmd, runtime_flags& f);
// Validates and converts; throws CLI::ValidationError with a clear message.
runtime_options to_runtime_options(const runtime_flags& f);

// Logger writing JSON lines to stderr at the level given by --log-level.
logger make_stderr_logger(log_level level);

}  // namespace cg::app
