#include "app/stripe_flags.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "app/cli.hpp"
#include "http/origin.hpp"

namespace cg::app {
namespace {
std::chrono::milliseconds ms(double s) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0));
}
}  // namespace

// The options themselves; add_stripe_flags declares their group and scope.
void add_stripe_option_flags(CLI::App& cmd, stripe_flags& f);

void add_stripe_flags(CLI::App& cmd, stripe_flags& f) {
    auto before = cmd.get_options().size();
    add_stripe_option_flags(cmd, f);
    // All connection settings: from CHARGEGUARD_<FLAG> in every subcommand.
    auto opts = cmd.get_options();
    for (auto i = before; i < opts.size(); ++i) env(opts[i]->group(group_stripe), env_scope::connection);
    // Added after the loop: a test-only switch that is never a connection setting read from the environment.
    add_allow_insecure_http_flag(cmd, f.allow_insecure_http);
}

void add_stripe_option_flags(CLI::App& cmd, stripe_flags& f) {
    cmd.add_option("--stripe-api-base", f.api_base, "Stripe API origin (or the vault proxy's)")
        ->capture_default_str();
    cmd.add_option("--stripe-key-file", f.key_file,
                   std::string("file holding the Stripe secret key (else STRIPE_API_KEY, else ") +
                       default_stripe_key_file + " if it exists)");
    cmd.add_option("--stripe-ca-file", f.ca_file,
                   "PEM CA bundle to verify the API with (default: system store)");
    cmd.add_option("--stripe-version", f.version, "Stripe-Version header")->capture_default_str();
    add_duration_option(cmd, "--stripe-connect-timeout", f.connect_timeout_s, "time for DNS + TCP + TLS",
                        0.001, 600.0);
    add_duration_option(cmd, "--stripe-request-timeout", f.request_timeout_s, "time for one Stripe request",
                        0.001, 600.0);
    cmd.add_option(
           "--stripe-max-connections", f.max_connections,
           "pooled connections to Stripe, and for consume its calls at once (0: for consume "
           "--max-in-flight, at least 16 and at most 128 — Stripe takes 100 requests/s; 16 elsewhere)")
        ->check(CLI::Range(0u, 65536u))
        ->capture_default_str();
    cmd.add_option("--stripe-connection-cap", f.connection_cap,
                   "most pooled connections to Stripe, whatever --max-in-flight is; --stripe-max-connections "
                   "may not exceed it")
        ->check(CLI::Range(1u, 65536u))
        ->capture_default_str();
    cmd.add_option(
           "--stripe-eager-connections", f.eager_connections,
           "connections opened on demand; past this many, one more only while Little's law (4 x answers/s x "
           "the fastest recent answer) and Stripe's pace (answers within 2x the fastest + 1 ms) call for it")
        ->check(CLI::Range(1u, 65536u))
        ->capture_default_str();
    cmd.add_option("--stripe-max-retries", f.max_retries, "retries with the same key for 409/429/not-sent")
        ->check(CLI::Range(0u, 20u))
        ->capture_default_str();
    add_duration_option(cmd, "--stripe-retry-initial", f.retry_initial_s,
                        "time before the first retry (doubles, jittered)", 0.0, 60.0);
    add_duration_option(cmd, "--stripe-retry-max", f.retry_max_s, "cap on the retry delay", 0.0, 300.0);
    cmd.add_option("--stripe-max-rate-limited-retries", f.max_rate_limited_retries,
                   "retries for 429 answers (never fewer than --stripe-max-retries)")
        ->check(CLI::Range(0u, 50u))
        ->capture_default_str();
    cmd.add_option("--stripe-max-rps", f.max_rps,
                   "hard ceiling on Stripe requests per second of this process (0: none)")
        ->check(CLI::Range(0.0, 100000.0))
        ->capture_default_str();
    cmd.add_option("--stripe-adaptive-rate", f.adaptive_rate,
                   "after a 429, back off below the rate Stripe accepted, then climb back and probe past it")
        ->capture_default_str();
    cmd.add_option("--stripe-rate-increase", f.rate_increase,
                   "probe past the estimate: requests/s added per second without a 429, on top of the "
                   "accelerating probe")
        ->check(CLI::Range(0.0, 1000.0))
        ->capture_default_str();
    cmd.add_option("--stripe-rate-decrease", f.rate_decrease,
                   "back-off: after a 429 the limit is this × the rate Stripe accepted")
        ->check(CLI::Range(0.05, 0.99))
        ->capture_default_str();
    cmd.add_option("--stripe-rate-initial", f.rate_initial,
                   "AIMD slow start: requests/s at start, doubling every 250 ms under load until a 429 (0: "
                   "unlimited)")
        ->check(CLI::Range(0.0, 100000.0))
        ->capture_default_str();
    cmd.add_option("--stripe-rate-min", f.rate_min, "AIMD floor in requests/s")
        ->check(CLI::Range(0.01, 100000.0))
        ->capture_default_str();
}

void add_allow_insecure_http_flag(CLI::App& cmd, bool& allowed) {
    env(cmd.add_flag(
            "--allow-insecure-http", allowed,
            "TESTS ONLY: accept an http:// Stripe or upstream origin (the key crosses the network in "
            "cleartext); command line only, never read from the environment"),
        env_scope::never);
}

void refuse_plain_http(const char* flag, const std::string& url, bool allowed) {
    auto o = http::parse_origin(url);
    if (!o) throw CLI::ValidationError(flag, o.err().message);
    if (!o->tls && !allowed)
        throw CLI::ValidationError(flag, url +
                                             " is plain http: the API key would cross the network in "
                                             "cleartext. Use https:// (--allow-insecure-http exists for "
                                             "tests only)");
}

result<void> check_key_shape(std::string_view key, std::string_view source, key_kinds kinds) {
    auto fail = [&](const std::string& why) {
        return error(core_errc::invalid_argument, "the key from " + std::string(source) + " " + why);
    };
    if (key.find_first_of("\r\n \t\v\f") != std::string_view::npos)
        return fail("contains whitespace (one key, nothing around it but a final newline)");
    for (std::string_view p : {"sk_test_", "sk_live_", "rk_test_", "rk_live_"})
        if (key.starts_with(p)) return {};
    if (kinds == key_kinds::stripe_or_vault && key.starts_with("cgvk_")) return {};
    return fail(kinds == key_kinds::stripe_or_vault
                    ? "is not a Stripe secret or restricted key (sk_test_, sk_live_, rk_test_, rk_live_) "
                      "nor a vault key (cgvk_)"
                    : "is not a Stripe secret or restricted key (sk_test_, sk_live_, rk_test_, rk_live_)");
}

namespace {
// The file to read the key from: the named one, else (no STRIPE_API_KEY either) the default if it exists.
std::string key_file_in_effect(const std::string& key_file, const char* env_value,
                               const std::string& default_file) {
    if (!key_file.empty() || (env_value && *env_value) || default_file.empty()) return key_file;
    std::error_code ec;
    return std::filesystem::exists(default_file, ec) ? default_file : std::string();
}
}  // namespace

std::string stripe_key_source(const std::string& key_file, const char* env_value,
                              const std::string& default_file) {
    auto file = key_file_in_effect(key_file, env_value, default_file);
    if (!file.empty()) return file;
    return env_value && *env_value ? "STRIPE_API_KEY" : "";
}

std::string stripe_key_source_for_messages(const std::string& key_file, const char* env_value,
                                           const std::string& default_file) {
    // Named as the operator wrote it: the flag, or CHARGEGUARD_STRIPE_KEY_FILE when the value came from
    // there.
    if (!key_file.empty())
        return (value_origin("--stripe-key-file", key_file).rfind("CHARGEGUARD_", 0) == 0
                    ? "CHARGEGUARD_STRIPE_KEY_FILE '"
                    : "--stripe-key-file '") +
               key_file + "'";
    auto source = stripe_key_source(key_file, env_value, default_file);
    return source == default_file ? "the default secret file '" + default_file + "'" : source;
}

result<std::string> read_stripe_key(const std::string& flag_file, const char* env_value,
                                    const std::string& default_file) {
    const std::string key_file = key_file_in_effect(flag_file, env_value, default_file);
    const std::string what = stripe_key_source_for_messages(flag_file, env_value, default_file);
    std::string key;
    if (!key_file.empty()) {
        struct stat sb {};
        if (::stat(key_file.c_str(), &sb) != 0)
            return error(core_errc::io_error, "cannot read " + what + ": " + std::strerror(errno));
        if (S_ISDIR(sb.st_mode))
            return error(core_errc::invalid_argument, what + " is a directory, not the file holding the key");
        std::ifstream in(key_file);
        if (!in) {
            int e = errno;
            std::string why = std::strerror(e);
            // The image runs as a non-root user: say which, so the fix (the file's mode or owner) is plain.
            if (e == EACCES) why += " (this process runs as uid " + std::to_string(::getuid()) + ")";
            return error(core_errc::io_error, "cannot read " + what + ": " + why);
        }
        std::stringstream ss;
        ss << in.rdbuf();
        key = ss.str();
        while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
        if (key.empty()) return error(core_errc::invalid_argument, what + " is empty");
    } else if (env_value && *env_value) {
        key = env_value;
    } else {
        return error(core_errc::invalid_argument,
                     "no Stripe key: set --stripe-key-file, STRIPE_API_KEY or mount " + default_file);
    }
    if (key.find_first_of("\r\n \t") != std::string::npos)
        return error(core_errc::invalid_argument, "the key from " + what + " contains whitespace");
    return key;
}

std::string read_checked_stripe_key(const std::string& key_file, key_kinds kinds) {
    // A key that cannot be read, or is not a key, is a configuration error (exit 78) wherever it came from:
    // the message names the source (flag, variable or default file), never the key.
    auto key = read_stripe_key(key_file, std::getenv("STRIPE_API_KEY"));
    if (!key) throw config_error(key.err().message);
    auto source = stripe_key_source_for_messages(key_file, std::getenv("STRIPE_API_KEY"));
    if (auto shape = check_key_shape(*key, source, kinds); !shape) throw config_error(shape.err().message);
    return std::move(*key);
}

stripe::client_config to_stripe_config(const stripe_flags& f) {
    stripe::client_config c;
    refuse_plain_http("--stripe-api-base", f.api_base, f.allow_insecure_http);
    c.api_base = f.api_base;
    c.api_key = read_checked_stripe_key(f.key_file, key_kinds::stripe_or_vault);
    c.ca_file = f.ca_file;
    c.stripe_version = f.version;
    c.connect_timeout = ms(f.connect_timeout_s);
    c.request_timeout = ms(f.request_timeout_s);
    if (f.max_connections > f.connection_cap)
        bad_value("--stripe-max-connections", std::to_string(f.max_connections),
                  "above --stripe-connection-cap (" + std::to_string(f.connection_cap) + ")");
    c.max_connections = f.max_connections ? f.max_connections : std::min(16u, f.connection_cap);
    c.eager_connections = f.eager_connections;
    c.retry.max_retries = f.max_retries;
    c.retry.initial_delay = ms(f.retry_initial_s);
    c.retry.max_delay = ms(f.retry_max_s);
    c.retry.max_rate_limited_retries = f.max_rate_limited_retries;
    c.rate.max_rps = f.max_rps;
    c.rate.adaptive = f.adaptive_rate;
    c.rate.increase_rps_per_s = f.rate_increase;
    c.rate.decrease_factor = f.rate_decrease;
    c.rate.min_rps = f.rate_min;
    c.rate.initial_rps = f.rate_initial;
    if (f.max_rps > 0 && f.rate_min > f.max_rps)
        throw usage_error("--stripe-rate-min must not exceed --stripe-max-rps");
    if (c.retry.max_delay < c.retry.initial_delay)
        throw usage_error("--stripe-retry-max must be at least --stripe-retry-initial");
    return c;
}

}  // namespace cg::app
