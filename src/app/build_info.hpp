// What this binary is: its version (meson.build), the source revision it was built from (`git describe` at
// build time; "unknown" outside a git checkout) and meson's build type.
#pragma once

#include <string>

#include "metrics/registry.hpp"

namespace cg::app {

struct build_info {
    const char* version;
    const char* revision;
    const char* build_type;
};

const build_info& current_build() noexcept;

// "chargeguard 0.1.0 (revision 0d90a46c1f2e, debug)": what `chargeguard version` and --version print.
std::string version_line();

// chargeguard_build_info{version,revision,build_type} 1.
void add_build_info_metric(metrics::registry& reg);

}  // namespace cg::app
