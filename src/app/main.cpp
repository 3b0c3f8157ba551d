// chargeguard: NSQ billing events → Stripe, exactly once. See README.md and DESIGN.md.
#include <cstdio>

#include "app/build_info.hpp"
#include "app/cli.hpp"
#include "app/commands.hpp"

int main(int argc, char** argv) {
    using namespace cg::app;
    CLI::App app{"chargeguard — charges Stripe exactly once for billing events from NSQ"};
    app.require_subcommand(1);
    app.set_version_flag("--version", version_line());
    global_flags globals;
    app.add_option("--log-level", globals.log_level, "debug | info | warn | error | off")
        ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}))
        ->capture_default_str();

    command_main selected;
    register_version(app, selected);
    register_migrate(app, selected);
    register_publish(app, selected);
    register_tail(app, selected);
    register_consume(app, selected);
    register_dead_letters(app, selected);
    register_reconcile(app, selected);
    register_probe(app, selected);
    register_vault(app, selected);
    register_proxy(app, selected);

    mirror_env(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        return selected ? selected(globals) : 0;
    } catch (const CLI::Error& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chargeguard: %s\n", e.what());
        return 1;
    }
}
