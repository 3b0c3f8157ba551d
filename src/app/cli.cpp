#include "app/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <asio/ip/address.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "app/commands.hpp"
#include "net/tls.hpp"

namespace cg::app {

const char* const exit_code_table =
    "Exit codes (every subcommand):\n"
    "  0   ok (explain: charged once; reconcile: everything explained)\n"
    "  1   runtime failure (NSQ, PostgreSQL or Stripe unreachable, I/O error; dead-letters replay: a letter\n"
    "      refused or not published; retry-declined: a row that could not be retried)\n"
    "  2   a check found a problem (explain: not charged once; reconcile: unexplained items or nothing to\n"
    "      check; dead-letters show: no such letter; retry-declined: a row not declined)\n"
    "  64  usage error: a bad flag, value or argument on the command line\n"
    "  78  configuration error: a bad CHARGEGUARD_* variable, or an unreadable/malformed secret file\n"
    "  129 a service drained after SIGHUP (it reloads nothing: its supervisor restarts it)\n"
    "  130 a second signal during a drain stopped it at once\n";

// In the library, not main.cpp: every subcommand calls it, and the tests link the subcommands without main.
log_level global_flags::level() const {
    return parse_log_level(log_level).value_or(cg::log_level::info);
}

namespace {

struct env_registry {
    std::unordered_map<const CLI::Option*, env_scope> scopes;
    std::unordered_set<const CLI::App*> services;
    std::vector<std::string> argv;
    bool argv_recorded = false;
};

env_registry& registry() {
    static env_registry r;
    return r;
}

bool on_command_line(const std::string& flag) {
    auto& r = registry();
    for (const auto& a : r.argv)
        if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
    return false;
}

}  // namespace

CLI::Option* env(CLI::Option* opt, env_scope scope) {
    registry().scopes[opt] = scope;
    return opt;
}

void service_command(CLI::App& cmd) {
    registry().services.insert(&cmd);
}

CLI::App* add_service_command(CLI::App& app, const std::string& name, const std::string& description,
                              const std::string& examples) {
    auto* cmd = app.add_subcommand(name, description);
    service_command(*cmd);
    cmd->footer("Examples:\n" + examples +
                "Durations: 250ms, 30s, 1m30s (a bare number is seconds). Every flag also reads "
                "CHARGEGUARD_<FLAG>.\n");
    return cmd;
}

std::string env_name_for(const std::string& prefix, const std::string& long_flag) {
    std::string out = prefix;
    for (char c : long_flag)
        out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

void mirror_env(CLI::App& app, const std::string& prefix) {
    auto& r = registry();
    bool service = r.services.count(&app) > 0;
    for (CLI::Option* opt : app.get_options()) {
        if (!opt->get_envname().empty() || opt->get_lnames().empty()) continue;
        const auto& name = opt->get_lnames().front();
        // --version prints and exits.
        if (name == "help" || name == "help-all" || name == "version") continue;
        auto it = r.scopes.find(opt);
        auto scope = it == r.scopes.end() ? env_scope::service : it->second;
        if (scope == env_scope::never || (scope == env_scope::service && !service)) continue;
        opt->envname(env_name_for(prefix, name));
    }
    for (CLI::App* sub : app.get_subcommands({})) mirror_env(*sub, prefix);
}

void record_command_line(int argc, const char* const* argv) {
    auto& r = registry();
    r.argv.assign(argv + (argc > 0 ? 1 : 0), argv + argc);
    r.argv_recorded = true;
}

std::string value_origin(const std::string& flag, const std::string& value) {
    auto name = env_name_for("CHARGEGUARD_", flag.substr(flag.find_first_not_of('-')));
    const char* e = std::getenv(name.c_str());
    bool from_env = e && value == e && (!registry().argv_recorded || !on_command_line(flag));
    return from_env ? name + "=" + value : flag + " " + value;
}

namespace {

constexpr std::string_view secret_prefixes[] = {"whsec_", "sk_live_", "sk_test_", "rk_live_", "rk_test_"};

bool secret_char(char c) noexcept {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// The start of the next secret-looking token at or after `from` (a prefix and at least one character of
// key material), or npos; `end` is set past its key material.
std::size_t next_secret(std::string_view text, std::size_t from, std::size_t& end) noexcept {
    std::size_t best = std::string_view::npos;
    for (auto p : secret_prefixes) {
        for (auto at = text.find(p, from); at != std::string_view::npos; at = text.find(p, at + 1)) {
            const auto body = at + p.size();
            if (body < text.size() && secret_char(text[body])) {
                if (at < best) {
                    best = at;
                    end = body;
                    while (end < text.size() && secret_char(text[end])) ++end;
                }
                break;
            }
        }
    }
    return best;
}

void long_names(const CLI::App& app, std::unordered_set<std::string>& out) {
    for (const CLI::Option* opt : app.get_options())
        for (const auto& n : opt->get_lnames()) out.insert("--" + n);
    for (const CLI::App* sub : app.get_subcommands({})) long_names(*sub, out);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diag = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            std::size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

}  // namespace

bool looks_like_secret(std::string_view text) noexcept {
    std::size_t end = 0;
    return next_secret(text, 0, end) != std::string_view::npos;
}

std::string redact_secrets(std::string_view text) {
    std::string out;
    std::size_t pos = 0, end = 0;
    for (auto at = next_secret(text, 0, end); at != std::string_view::npos;
         at = next_secret(text, pos, end)) {
        out.append(text.substr(pos, at - pos));
        out.append("[redacted]");
        pos = end;
    }
    out.append(text.substr(pos));
    return out;
}

std::string unknown_flag_message(const CLI::App& app) {
    std::unordered_set<std::string> known;
    long_names(app, known);
    for (const auto& a : registry().argv) {
        if (a == "--") break;
        if (a.rfind("--", 0) != 0 || a.size() <= 2) continue;
        std::string flag = a.substr(0, a.find('='));
        if (known.count(flag)) continue;
        std::string best;
        std::size_t best_d = 3;  // suggest only a near miss: a typo, a transposition, a missing letter
        for (const auto& k : known) {
            auto d = edit_distance(flag, k);
            if (d < best_d || (d == best_d && !best.empty() && k < best)) best_d = d, best = k;
        }
        return "unknown flag " + flag + (best.empty() ? "" : " (did you mean " + best + "?)");
    }
    return {};
}

namespace {

// Whether option `flag` of `app` or of the subcommand being run (the parsed ones) reads environment
// variable `name`: a variable that is set but never read for that option (another subcommand's, or a
// selector that comes from the command line only) must not take the blame.
bool reads_variable(const CLI::App& app, const std::string& flag, const std::string& name) {
    for (const CLI::Option* opt : app.get_options())
        if (opt->get_envname() == name)
            for (const auto& n : opt->get_lnames())
                if ("--" + n == flag) return true;
    for (const CLI::App* sub : app.get_subcommands())
        if (reads_variable(*sub, flag, name)) return true;
    return false;
}

}  // namespace

std::pair<std::string, bool> attribute_to_environment(const CLI::App& app, const std::string& what) {
    auto at = what.find("--");
    if (at == std::string::npos) return {what, false};
    auto end = at + 2;
    while (end < what.size() && (std::isalnum(static_cast<unsigned char>(what[end])) || what[end] == '-'))
        ++end;
    std::string flag = what.substr(at, end - at);
    if (flag.size() <= 2) return {what, false};
    auto name = env_name_for("CHARGEGUARD_", flag.substr(2));
    const char* e = std::getenv(name.c_str());
    if (!e || (registry().argv_recorded && on_command_line(flag)) || !reads_variable(app, flag, name))
        return {what, false};
    std::string out = what;
    for (auto p = out.find(flag); p != std::string::npos; p = out.find(flag, p + name.size())) {
        auto after = p + flag.size();
        bool whole = after == out.size() ||
                     !(std::isalnum(static_cast<unsigned char>(out[after])) || out[after] == '-');
        if (whole) out.replace(p, flag.size(), name);
    }
    return {out, true};
}

void bad_value(const std::string& flag, const std::string& value, const std::string& why) {
    auto origin = value_origin(flag, value);
    if (origin.rfind("CHARGEGUARD_", 0) == 0) throw config_error(origin + ": " + why);
    throw usage_error(origin + ": " + why);
}

namespace {

constexpr const char* not_a_duration = "not a duration (e.g. 250ms, 30s, 1m30s; a bare number is seconds)";

// Microseconds, so that "500us" and "0.0005" keep their precision.
std::optional<std::int64_t> parse_duration_us(std::string_view s) {
    if (s.empty()) return std::nullopt;
    double total_us = 0;
    bool first = true;
    while (!s.empty()) {
        double v = 0;
        auto r = std::from_chars(s.data(), s.data() + s.size(), v);
        if (r.ec != std::errc{} || v < 0 || !std::isfinite(v)) return std::nullopt;
        s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
        if (first && s.empty()) {
            total_us = v * 1e6;  // a bare number: seconds
            break;
        }
        first = false;
        std::size_t n = 0;
        while (n < s.size() && s[n] >= 'a' && s[n] <= 'z') ++n;
        auto unit = s.substr(0, n);
        s.remove_prefix(n);
        double mult;
        if (unit == "us")
            mult = 1;
        else if (unit == "ms")
            mult = 1e3;
        else if (unit == "s")
            mult = 1e6;
        else if (unit == "m")
            mult = 60e6;
        else if (unit == "h")
            mult = 3600e6;
        else
            return std::nullopt;
        total_us += v * mult;
    }
    if (total_us > 1e15) return std::nullopt;
    return static_cast<std::int64_t>(std::llround(total_us));
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view s) {
    auto us = parse_duration_us(s);
    if (!us) return std::nullopt;
    return std::chrono::milliseconds((*us + 500) / 1000);
}

std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& v) {
    auto d = parse_duration(v);
    if (!d) bad_value(flag, v, not_a_duration);
    return *d;
}

std::string format_duration(double seconds) {
    auto us = static_cast<long long>(std::llround(seconds * 1e6));
    if (us == 0) return "0s";
    if (us % 1000000 != 0) {
        if (us % 1000 == 0) return std::to_string(us / 1000) + "ms";
        return std::to_string(us) + "us";
    }
    long long s = us / 1000000;
    std::string out;
    if (s >= 3600) out += std::to_string(s / 3600) + "h", s %= 3600;
    if (s >= 60) out += std::to_string(s / 60) + "m", s %= 60;
    if (s > 0 || out.empty()) out += std::to_string(s) + "s";
    return out;
}

CLI::Option* add_duration_option(CLI::App& cmd, const std::string& name, double& seconds,
                                 const std::string& help, double min_s, double max_s) {
    auto* opt = cmd.add_option(
        name,
        [&seconds, name, min_s, max_s](const CLI::results_t& r) {
            const std::string& v = r.back();
            auto us = parse_duration_us(v);
            if (!us) bad_value(name, v, not_a_duration);
            double s = static_cast<double>(*us) / 1e6;
            if (s < min_s || s > max_s)
                bad_value(name, v,
                          "out of range " + format_duration(min_s) + " .. " + format_duration(max_s));
            seconds = s;
            return true;
        },
        help);
    opt->type_name("DURATION")->default_str(format_duration(seconds));
    return opt;
}

void add_runtime_flags(CLI::App& cmd, runtime_flags& f) {
    cmd.add_option("--health-listen", f.health_listen, "address for /healthz, /readyz, /metrics")
        ->capture_default_str()
        ->group(group_runtime);
    cmd.add_option("--offload-threads", f.offload_threads, "threads for blocking and Stripe work")
        ->check(CLI::Range(1u, 64u))
        ->capture_default_str()
        ->group(group_runtime);
    add_duration_option(cmd, "--shutdown-timeout", f.shutdown_timeout_s,
                        "how long to drain on SIGTERM before giving up", 0.0, 3600.0)
        ->group(group_runtime);
    add_duration_option(cmd, "--max-loop-lag", f.max_loop_lag_s, "event-loop lag above which /healthz fails",
                        0.001, 60.0)
        ->group(group_runtime);
    add_duration_option(
        cmd, "--loop-lag-interval", f.loop_lag_interval_s,
        "time between the event-loop lag probe's samples (chargeguard_event_loop_lag_seconds); "
        "shorter gives a lag p99 from more samples, at one timer turn per sample",
        0.001, 10.0)
        ->group(group_runtime);
    add_duration_option(
        cmd, "--loop-turn-budget", f.loop_turn_budget_s,
        "how long a turn of the event loop runs deliveries' steps before the rest wait for the "
        "next turn, behind sockets and timers (bounds the loop's lag under load; 0 = unbounded)",
        0.0, 0.1)
        ->group(group_runtime);
    cmd.add_option("--health-tls-cert-file", f.health_tls_cert_file,
                   "PEM certificate chain: serve the health listener over HTTPS (with --health-tls-key-file)")
        ->group(group_runtime);
    cmd.add_option("--health-tls-key-file", f.health_tls_key_file,
                   "PEM private key for --health-tls-cert-file")
        ->group(group_runtime);
    cmd.add_option("--health-basic-auth-file", f.health_basic_auth_file,
                   "file of user:hash lines (bcrypt, yescrypt or SHA-crypt, e.g. `htpasswd -nB USER`): "
                   "/metrics and /config then need basic-auth credentials; /healthz, /readyz and "
                   "/startupz stay open")
        ->group(group_runtime);
    // An acknowledgement: never from the environment.
    env(cmd.add_flag("--health-basic-auth-over-http", f.health_basic_auth_over_http,
                     "allow --health-basic-auth-file on a non-loopback --health-listen without TLS (only "
                     "behind something that terminates TLS: the password otherwise crosses in clear text)")
            ->group(group_runtime),
        env_scope::never);
}

namespace {
std::chrono::steady_clock::duration from_seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

runtime_options to_runtime_options(const runtime_flags& f) {
    runtime_options o;
    auto hp = net::parse_host_port(f.health_listen);
    if (!hp) bad_value("--health-listen", f.health_listen, hp.err().code.message());
    o.health_listen = *hp;
    o.offload_threads = f.offload_threads;
    o.shutdown_timeout = from_seconds(f.shutdown_timeout_s);
    o.max_loop_lag = from_seconds(f.max_loop_lag_s);
    o.lag_interval = from_seconds(f.loop_lag_interval_s);
    o.turn_budget = std::chrono::microseconds(std::llround(f.loop_turn_budget_s * 1e6));
    if (f.health_tls_cert_file.empty() != f.health_tls_key_file.empty())
        throw usage_error("--health-tls-cert-file and --health-tls-key-file go together");
    if (!f.health_tls_cert_file.empty()) {
        auto tls = net::make_tls_server_context({f.health_tls_cert_file, f.health_tls_key_file});
        if (!tls) throw config_error("--health-tls-cert-file/--health-tls-key-file: " + tls.err().message);
        o.health_tls = *tls;
    }
    if (!f.health_basic_auth_file.empty()) {
        auto auth = health_auth::load(f.health_basic_auth_file);
        if (!auth) throw config_error("--health-basic-auth-file: " + auth.err().message);
        o.health_basic_auth = *auth;
        std::error_code ec;
        auto a = asio::ip::make_address(hp->host, ec);
        bool loopback = !ec && a.is_loopback();
        // 64 from the command line, 78 from CHARGEGUARD_HEALTH_BASIC_AUTH_FILE (bad_value).
        if (!o.health_tls && !loopback && !f.health_basic_auth_over_http)
            bad_value(
                "--health-basic-auth-file", f.health_basic_auth_file,
                "basic auth on --health-listen " + f.health_listen +
                    " (not loopback) without --health-tls-cert-file: the password would cross the network "
                    "in clear text. Give the TLS files, or --health-basic-auth-over-http when a proxy in "
                    "front terminates TLS");
    }
    return o;
}

void add_runtime_settings(effective_config& c, const runtime_flags& f, const runtime_options& o) {
    c.add("health_listen", f.health_listen)
        .add("health_tls", o.health_tls != nullptr)
        .add("health_tls_cert_file", f.health_tls_cert_file)
        .add("health_basic_auth_file", f.health_basic_auth_file)
        .add("health_basic_auth_users", o.health_basic_auth ? o.health_basic_auth->users() : std::size_t{0})
        .add("offload_threads", o.offload_threads)
        .add("shutdown_timeout_s", f.shutdown_timeout_s)
        .add("max_loop_lag_s", f.max_loop_lag_s)
        .add("loop_lag_interval_s", f.loop_lag_interval_s)
        .add("loop_turn_budget_us", static_cast<std::int64_t>(o.turn_budget.count()));
}

std::string default_operator() {
    const char* u = std::getenv("USER");
    if (!u || !*u) u = std::getenv("LOGNAME");
    std::string who = u && *u ? u : "unknown";
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0 && host[0]) who += std::string("@") + host;
    return who;
}

logger make_stderr_logger(log_level level) {
    // Never a write(2) on the caller's thread: the event loop logs too (core/log.hpp async_fd_sink).
    return logger(std::make_shared<async_fd_sink>(2), level);
}

}  // namespace cg::app
