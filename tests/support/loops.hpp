// A test's main loop and offload pool, torn down as app::runtime tears down its own (net::loop_pair).
#pragma once

#include "net/offload.hpp"

namespace cg::test {

using loops = net::loop_pair;

}  // namespace cg::test
