// The effective configuration of a service: every setting after flags, environment and defaults, with
// what was derived from them, and no secret (a secret's source is named, never its value or its file's
// content). One list serves the startup log line, `consume --validate` and GET /config on the health
// listener, so the three cannot disagree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/log.hpp"

namespace cg::app {

class effective_config {
  public:
    using value = std::variant<std::string, std::int64_t, std::uint64_t, double, bool>;

    explicit effective_config(std::string command) : command_(std::move(command)) {}

    // Appends a setting (keys keep the order they were added in).
    effective_config& add(std::string key, value v);
    template <typename I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) effective_config& add(std::string key, I v) {
        if constexpr (std::is_signed_v<I>)
            return add(std::move(key), value(static_cast<std::int64_t>(v)));
        else
            return add(std::move(key), value(static_cast<std::uint64_t>(v)));
    }
    effective_config& add(std::string key, const char* v) {
        return add(std::move(key), value(std::string(v)));
    }

    // Appends a setting that names where a dependency lives (a host, a port, a database user): logged and
    // printed by --validate, but left out of a /config that anyone on the network may read, as /readyz
    // leaves out the same details there.
    effective_config& add_address(std::string key, std::string v);
    // Several such places, comma-joined as they are given on the command line.
    effective_config& add_address(std::string key, const std::vector<std::string>& v);

    const std::string& command() const noexcept { return command_; }
    // The settings as log fields (views into this object).
    std::vector<log_field> fields() const;
    // Logs `msg` at info with every setting as a field.
    void log(const logger& log, std::string_view msg) const;
    // {"command":"consume","settings":{"topic":"billing",…}}, one line, with a trailing newline. With
    // `redact_addresses`, each add_address value is "(redacted)".
    std::string json(bool redact_addresses = false) const;

  private:
    struct setting {
        std::string key;
        value v;
        bool address = false;
    };
    std::string command_;
    std::vector<setting> settings_;
};

}  // namespace cg::app
