// Work that holds the calling thread for `d` without sleeping: a step that costs the event loop CPU time,
// as a delivery's parsing or TLS work does (tests of turn pacing).
#pragma once

#include <chrono>

namespace cg::test {

inline void busy_for(std::chrono::microseconds d) {
    auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
    }
}

}  // namespace cg::test
