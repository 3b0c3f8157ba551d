// CLI helpers shared by subcommands: where an option may take its value from, one duration syntax, the
// exit-code table, and errors that say where a bad value came from.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "app/runtime.hpp"
#include "core/log.hpp"

namespace cg::app {

// Exit codes, the same meaning in every subcommand (sysexits-style for usage and configuration errors).
// main.cpp maps every CLI11 error onto these: CLI11's own codes (100+) never reach the shell.
inline constexpr int exit_ok = 0;       // done; a check found nothing wrong
inline constexpr int exit_failure = 1;  // a runtime failure (a dependency unreachable, I/O failed, …)
inline constexpr int exit_problem = 2;  // a check ran and found a problem (not charged, unexplained, …)
inline constexpr int exit_usage = 64;   // EX_USAGE: bad command line
inline constexpr int exit_config = 78;  // EX_CONFIG: bad environment variable or configuration file
// The table as `--help` prints it in its footer (docs/operating/cli.md holds the same table).
extern const char* const exit_code_table;

// A bad command line: exit 64.
struct usage_error : CLI::ValidationError {
    explicit usage_error(std::string msg) : CLI::ValidationError(std::move(msg), exit_usage) {}
};
// A bad value from the environment or a bad configuration file (secret, CA bundle): exit 78.
struct config_error : CLI::ValidationError {
    explicit config_error(std::string msg) : CLI::ValidationError(std::move(msg), exit_config) {}
};

// Where the environment may supply an option's value: a property declared with the option.
enum class env_scope {
    // Never: a selector that consumes, deletes, replays or re-routes (tail's --channel, replay's ids,
    // --reason and --topic, …), and acknowledgements of dangerous settings. Command line only.
    never,
    // Connection settings (NSQ/PostgreSQL/Stripe addresses, TLS, secrets' files, timeouts, key namespace,
    // log level): from CHARGEGUARD_<FLAG> in every subcommand.
    connection,
    // Everything else (the default): from CHARGEGUARD_<FLAG> only in the long-running services
    // (consume, proxy, migrate — see service_command), never in operator tools.
    service,
};
// Declares `opt`'s scope; returns `opt` for chaining.
CLI::Option* env(CLI::Option* opt, env_scope scope);
// Declares `cmd` a long-running service: its service-scoped options read the environment.
void service_command(CLI::App& cmd);
// Adds the subcommand `name` as a service (service_command) whose help ends with "Examples:", `examples` (one
// indented command a line) and the note on durations and CHARGEGUARD_<FLAG> every service shares.
CLI::App* add_service_command(CLI::App& app, const std::string& name, const std::string& description,
                              const std::string& examples);

// Gives the long options of `app` and its subcommands (recursively) the environment variable
// CHARGEGUARD_<FLAG_IN_UPPER_SNAKE> where their env_scope allows it. Call once, after every option exists.
void mirror_env(CLI::App& app, const std::string& prefix = "CHARGEGUARD_");
std::string env_name_for(const std::string& prefix, const std::string& long_flag);

// main() records the command line so that errors can say whether a value came from it or the environment.
void record_command_line(int argc, const char* const* argv);
// "CHARGEGUARD_SHUTDOWN_TIMEOUT=abc" when `flag`'s (e.g. "--shutdown-timeout") value `value` came from its
// environment variable, else "--shutdown-timeout abc".
std::string value_origin(const std::string& flag, const std::string& value);
// A CLI11 error about an option ("Could not convert: --max-in-flight = abc", "--x: Value 0 not in range …")
// whose value came from its CHARGEGUARD_<FLAG> variable (one an option of `app` reads), not the command
// line: the message naming the variable instead of the flag, and true (a configuration error). Otherwise
// the message as it was, and false.
std::pair<std::string, bool> attribute_to_environment(const CLI::App& app, const std::string& what);
// "unknown flag --topci (did you mean --topic?)" for the first `--flag` of the recorded command line that no
// option of `app` or its subcommands has, the nearest known one suggested; empty when every flag is known.
// CLI11 reports a missing required option before an unexpected one, so a typo of a required flag would
// otherwise be reported as the flag it meant being missing.
std::string unknown_flag_message(const CLI::App& app);
// Throws config_error (value from the environment) or usage_error: "<value_origin>: <why>".
[[noreturn]] void bad_value(const std::string& flag, const std::string& value, const std::string& why);

// Whether `text` holds what looks like a Stripe secret (whsec_, sk_live_, sk_test_, rk_live_ or rk_test_
// followed by key material): an operator who typed one where a path or a flag belongs. Messages name the
// flag instead.
bool looks_like_secret(std::string_view text) noexcept;
// `text` with every such token (the prefix and its letters, digits and underscores) replaced by
// "[redacted]": the last guard on what main() prints, whatever message carried an operator's argument.
std::string redact_secrets(std::string_view text);

// One duration syntax for every time flag and variable: Go-style ("250ms", "30s", "1m30s", "2h", "1.5s");
// a bare number means seconds ("30", "0.5"). Adds `name` storing seconds into `seconds`, refusing values
// outside [min_s, max_s] with bad_value.
CLI::Option* add_duration_option(CLI::App& cmd, const std::string& name, double& seconds,
                                 const std::string& help, double min_s, double max_s);
// The parser behind it, for options kept as strings: nullopt when malformed.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view s);
// parse_duration for `flag`'s value; bad_value ("… is not a duration …") when malformed.
std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& value);
// Formats seconds the way the syntax above reads them ("30s", "250ms", "1m30s").
std::string format_duration(double seconds);

// Help groups (CLI11 ->group()), one name per kind of option.
inline constexpr const char* group_nsq = "NSQ";
inline constexpr const char* group_pg = "PostgreSQL";
inline constexpr const char* group_stripe = "Stripe";
inline constexpr const char* group_pipeline = "Pipeline";
inline constexpr const char* group_runtime = "Runtime";

// Options every long-running subcommand shares (--health-listen, --offload-threads, …).
struct runtime_flags {
    std::string health_listen = "127.0.0.1:9180";
    unsigned offload_threads = 2;
    double shutdown_timeout_s = 30;
    double max_loop_lag_s = 0.2;
    double loop_lag_interval_s = 0.05;
    double loop_turn_budget_s = 0.0005;
    std::string health_tls_cert_file, health_tls_key_file;  // HTTPS on --health-listen
    std::string health_basic_auth_file;                     // user:hash lines guarding /metrics and /config
    bool health_basic_auth_over_http = false;               // acknowledgement: auth without TLS off loopback
};
void add_runtime_flags(CLI::App& cmd, runtime_flags& f);
// Validates and converts; throws usage_error/config_error with a clear message.
runtime_options to_runtime_options(const runtime_flags& f);
// The runtime flags' part of a service's effective configuration (files named, never read out).
void add_runtime_settings(effective_config& c, const runtime_flags& f, const runtime_options& o);

// Logger writing JSON lines to stderr at the level given by --log-level.
logger make_stderr_logger(log_level level);

// Who runs an operator command, for the records it writes (a replay, a dismissal, a retry) when --by is not
// given: $USER (or $LOGNAME) @ the host name.
std::string default_operator();

}  // namespace cg::app
