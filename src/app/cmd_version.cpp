#include <cstdio>

#include "app/build_info.hpp"
#include "app/commands.hpp"

namespace cg::app {

void register_version(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("version", "print the version, source revision and build type, and exit");
    cmd->callback([&selected] {
        selected = [](const global_flags&) {
            std::printf("%s\n", version_line().c_str());
            return 0;
        };
    });
}

}  // namespace cg::app
