#include <cstdio>

#include "app/commands.hpp"

namespace cg::app {

void register_version(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("version", "print the version and exit");
    cmd->callback([&selected] {
        selected = [](const global_flags&) {
            std::printf("chargeguard %s\n", CHARGEGUARD_VERSION);
            return 0;
        };
    });
}

}  // namespace cg::app
