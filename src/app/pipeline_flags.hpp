// The charge pipeline's own flags of `consume` (leases, requeue delays, the key namespace, group commit), as
// Go-style durations like the NSQ flags, and their conversion to a billing::charge_flow_config with
// validation that names the flag at fault.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "billing/flow/charge_flow.hpp"

namespace cg::app {

struct pipeline_flags {
    std::string key_namespace = "chargeguard";
    std::string lease = "60s";
    std::string lease_renew_interval = "15s";
    std::string lease_held_delay = "10s";
    std::string retry_same_key_delay = "5s";
    std::string indeterminate_delay = "30s";
    std::string correction_wait_delay = "30s";
    std::string search_failed_delay = "30s";
    std::string new_key_quiet = "5m";
    std::string group_commit_linger_max = "2ms";
};

// Adds the flags to `cmd`, in the "Pipeline" group of --help.
void add_pipeline_flags(CLI::App& cmd, pipeline_flags& f);

// Validates and converts; throws CLI::ValidationError naming the flag at fault.
billing::charge_flow_config to_pipeline_config(const pipeline_flags& f);

}  // namespace cg::app
