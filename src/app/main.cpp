// chargeguard: NSQ billing events → Stripe, exactly once. See README.md and docs/design.md.
#include <cstdio>

#include "app/build_info.hpp"
#include "app/cli.hpp"
#include "app/commands.hpp"

namespace {

// Every CLI error becomes one of the exit codes of cli.hpp: help is 0, our own errors carry 64 or 78, and
// CLI11's codes (100+: a missing, unknown or malformed argument) are usage errors.
// A CLI11 error about a value that came from CHARGEGUARD_<FLAG> names that variable and is a configuration
// error, like the project's own checks (docs/operating/cli.md "Exit codes").
int report(CLI::App& app, const CLI::Error& e) {
    int code = e.get_exit_code();
    if (code == 0) return app.exit(e);
    if (auto unknown = cg::app::unknown_flag_message(app); !unknown.empty()) {
        std::fprintf(stderr, "chargeguard: %s\nRun with --help for more information.\n",
                     cg::app::redact_secrets(unknown).c_str());
        return cg::app::exit_usage;
    }
    auto [what, from_env] = cg::app::attribute_to_environment(app, e.what());
    // An operator's argument may be a secret typed in the wrong place: never echoed.
    std::fprintf(stderr, "chargeguard: %s\n", cg::app::redact_secrets(what).c_str());
    if (code == cg::app::exit_config || from_env) return cg::app::exit_config;
    std::fprintf(stderr, "Run with --help for more information.\n");
    return cg::app::exit_usage;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace cg::app;
    CLI::App app{"chargeguard — charges Stripe exactly once for billing events from NSQ"};
    app.require_subcommand(1);
    // Root options (--log-level) are accepted after the subcommand too: subcommands inherit this.
    app.fallthrough();
    app.footer(exit_code_table);
    app.set_version_flag("--version", version_line());
    global_flags globals;
    env(app.add_option("--log-level", globals.log_level, "debug | info | warn | error | off")
            ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}))
            ->capture_default_str(),
        env_scope::connection);

    command_main selected;
    register_version(app, selected);
    register_migrate(app, selected);
    register_publish(app, selected);
    register_tail(app, selected);
    register_consume(app, selected);
    register_dead_letters(app, selected);
    register_reconcile(app, selected);
    register_explain(app, selected);
    register_retry_declined(app, selected);
    register_probe(app, selected);
    register_vault(app, selected);
    register_proxy(app, selected);
    register_webhooks(app, selected);

    mirror_env(app);
    record_command_line(argc, argv);
    try {
        app.parse(argc, argv);
    } catch (const CLI::Error& e) {
        return report(app, e);
    }
    try {
        return selected ? selected(globals) : 0;
    } catch (const CLI::Error& e) {
        return report(app, e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chargeguard: %s\n", redact_secrets(e.what()).c_str());
        return exit_failure;
    }
}
