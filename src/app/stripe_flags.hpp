// Stripe flags shared by the subcommands that talk to Stripe (consume, proxy, reconcile). The API key
// comes from --stripe-key-file, STRIPE_API_KEY or the default secret file, never from argv.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/result.hpp"
#include "stripe/config.hpp"

namespace cg::app {

// consume's Stripe pool and its calls at once when --stripe-max-connections is not given (fewer when
// --max-in-flight is smaller, never fewer than 16). Stripe accepts 100 requests/s in live mode and 25 in
// test mode; 128 calls at once carry 100/s while its answers take up to 1.28 s on average (they take
// 0.3-0.6 s), and a call past Stripe's limit gains nothing from a connection of its own: it is paced or
// answered 429. Each pooled TLS connection holds ~70 KiB, and each call under way its request and
// coroutines, so a pool that followed --max-in-flight (thousands) cost memory for no charge per second.
inline constexpr unsigned consume_stripe_connections = 128;

struct stripe_flags {
    std::string api_base = "https://api.stripe.com";
    std::string key_file;
    std::string ca_file;
    std::string version = "2024-06-20";
    double connect_timeout_s = 5;
    double request_timeout_s = 30;
    unsigned max_connections = 0;    // 0: consume_stripe_connections for consume, 16 elsewhere
    unsigned connection_cap = 1024;  // bounds max_connections, given or derived
    unsigned eager_connections = 64;
    unsigned max_retries = 2;
    double retry_initial_s = 0.5;
    double retry_max_s = 5;
    unsigned max_rate_limited_retries = 8;
    // Rate control (stripe/rate_control.hpp).
    double max_rps = 0;
    bool adaptive_rate = true;
    double rate_increase = 0;
    double rate_decrease = stripe::rate_config{}.decrease_factor;
    double rate_min = 1;
    double rate_initial = 10;
    // Test-only: accept an http:// --stripe-api-base (the key would travel in cleartext). Command line only.
    bool allow_insecure_http = false;
};

void add_stripe_flags(CLI::App& cmd, stripe_flags& f);

// The secret file Docker and Kubernetes secrets conventionally mount; read only when it exists and neither
// --stripe-key-file nor STRIPE_API_KEY is given.
inline constexpr const char* default_stripe_key_file = "/run/secrets/stripe_api_key";

// Where the key comes from, for logs (never the key): `key_file` when set, else "STRIPE_API_KEY" when
// `env_value` is set, else `default_file` when it exists, else empty.
std::string stripe_key_source(const std::string& key_file, const char* env_value,
                              const std::string& default_file = default_stripe_key_file);

// The same source as named in messages: "--stripe-key-file 'F'" for a file the flag or its variable named,
// "STRIPE_API_KEY", or "the default secret file 'F'".
std::string stripe_key_source_for_messages(const std::string& key_file, const char* env_value,
                                           const std::string& default_file = default_stripe_key_file);

// The key, with one precedence: `key_file` (--stripe-key-file / CHARGEGUARD_STRIPE_KEY_FILE, trailing
// whitespace trimmed), else `env_value` (STRIPE_API_KEY), else `default_file` if it exists.
// A key file must be a readable regular file (not a directory); errors name the file and why.
result<std::string> read_stripe_key(const std::string& key_file, const char* env_value,
                                    const std::string& default_file = default_stripe_key_file);

// Which keys a command takes: Stripe's own secret or restricted keys (sk_test_, sk_live_, rk_test_,
// rk_live_), and for a client of the vault proxy also its keys (cgvk_).
enum class key_kinds { stripe_only, stripe_or_vault };
// Checks the key's shape: a known prefix and no whitespace. `source` names where it came from
// ("STRIPE_API_KEY", "--stripe-key-file '/run/secrets/k'") for the message, which never shows the key.
result<void> check_key_shape(std::string_view key, std::string_view source, key_kinds kinds);
// read_stripe_key (STRIPE_API_KEY from the environment unless `key_file` is given), then check_key_shape.
// Throws CLI::ValidationError naming the flag or variable at fault; never echoes the key.
std::string read_checked_stripe_key(const std::string& key_file, key_kinds kinds);

// Refuses a plain-http origin unless `allowed` (--allow-insecure-http): the API key would cross the
// network in cleartext. `flag` names the option for the message. Throws CLI::ValidationError.
void refuse_plain_http(const char* flag, const std::string& url, bool allowed);
// Adds --allow-insecure-http (test-only; deliberately not mirrored from an environment variable).
void add_allow_insecure_http_flag(CLI::App& cmd, bool& allowed);

// Validates and converts, reading the key (from the environment's STRIPE_API_KEY unless a key file is
// given). Throws CLI::ValidationError with a clear message; never echoes the key.
stripe::client_config to_stripe_config(const stripe_flags& f);

}  // namespace cg::app
