// Subcommand registration. Each subcommand lives in its own cmd_<name>.cpp and adds itself to the CLI;
// the function it sets as callback runs after parsing and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

#include "core/log.hpp"

namespace cg::app {

struct global_flags {
    std::string log_level = "info";
    cg::log_level level() const;
};

// What a parsed subcommand wants to run.
using command_main = std::function<int(const global_flags&)>;

void register_version(CLI::App& app, command_main& selected);
void register_migrate(CLI::App& app, command_main& selected);
void register_publish(CLI::App& app, command_main& selected);
void register_tail(CLI::App& app, command_main& selected);
void register_consume(CLI::App& app, command_main& selected);
void register_dead_letters(CLI::App& app, command_main& selected);
void register_reconcile(CLI::App& app, command_main& selected);
void register_explain(CLI::App& app, command_main& selected);
void register_retry_declined(CLI::App& app, command_main& selected);
void register_probe(CLI::App& app, command_main& selected);
void register_vault(CLI::App& app, command_main& selected);
void register_proxy(CLI::App& app, command_main& selected);
void register_webhooks(CLI::App& app, command_main& selected);

}  // namespace cg::app
