// The CLI helpers of app/cli.hpp: the exit-code table, where an option takes its value from (flag or
// CHARGEGUARD_* variable) and errors that say so, secret redaction, unknown-flag hints, the operator's name
// and the stderr logger. The durations are cli_durations.cpp, the runtime flags runtime_flags.cpp.
#include "app/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "app/commands.hpp"

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
