// Stripe flags shared by the subcommands that talk to Stripe (consume, proxy, reconcile). The API key
// comes from --stripe-key-file, STRIPE_API_KEY or the default secret file, never from argv.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/result.hpp"
#include "stripe/config.hpp"

namespace cg::app {

struct stripe_flags {
    std::string api_base = "https://api.stripe.com";
    std::string key_file;
    std::string ca_file;
    std::string version = "2024-06-20";
    double connect_timeout_s = 5;
    double request_timeout_s = 30;
    unsigned max_connections = 0;    // 0: --max-in-flight for consume (at least 16), 16 elsewhere
    unsigned connection_cap = 1024;  // bounds max_connections, given or derived
    unsigned eager_connections = 64;
    unsigned max_retries = 2;
    double retry_initial_s = 0.5;
    double retry_max_s = 5;
    unsigned max_rate_limited_retries = 8;
    // Rate control (stripe/rate_control.hpp).
    double max_rps = 0;
    bool adaptive_rate = true;
    double rate_increase = 0.2;
    double rate_decrease = 0.7;
    double rate_min = 1;
    double rate_initial = 10;
};

void add_stripe_flags(CLI::App& cmd, stripe_flags& f);

// The secret file Docker and Kubernetes secrets conventionally mount; read only when it exists and neither
// --stripe-key-file nor STRIPE_API_KEY is given.
inline constexpr const char* default_stripe_key_file = "/run/secrets/stripe_api_key";

// Where the key comes from, for logs (never the key): `key_file` when set, else "STRIPE_API_KEY" when
// `env_value` is set, else `default_file` when it exists, else empty.
std::string stripe_key_source(const std::string& key_file, const char* env_value,
                              const std::string& default_file = default_stripe_key_file);

// The key, with one precedence: `key_file` (--stripe-key-file / CHARGEGUARD_STRIPE_KEY_FILE, trailing
// whitespace trimmed), else `env_value` (STRIPE_API_KEY), else `default_file` if it exists.
result<std::string> read_stripe_key(const std::string& key_file, const char* env_value,
                                    const std::string& default_file = default_stripe_key_file);

// Validates and converts, reading the key (from the environment's STRIPE_API_KEY unless a key file is
// given). Throws CLI::ValidationError with a clear message; never echoes the key.
stripe::client_config to_stripe_config(const stripe_flags& f);

}  // namespace cg::app
