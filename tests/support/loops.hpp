// A test's main loop and offload pool, torn down as app::runtime tears down its own: the pool's threads
// stopped and joined, then the handlers still queued on both contexts destroyed while both exist. Freed one
// after the other instead, a coroutine frame left on the main loop (a pool's maintenance task caught in a
// connect) would hand a connection's PQfinish to a pool already freed.
#pragma once

#include "net/offload.hpp"

namespace cg::test {

struct loops {
    net::shutdown_io_context io{1};
    net::offload_pool offload;

    explicit loops(unsigned offload_threads = 2) : offload(offload_threads) {}
    loops(const loops&) = delete;
    loops& operator=(const loops&) = delete;
    ~loops() { shut_down(); }

    // Idempotent; a fixture whose other members the queued handlers refer to calls it from its own
    // destructor, before those members go.
    void shut_down() {
        offload.stop();
        offload.join();
        io.shutdown();
        offload.shutdown();
    }
};

}  // namespace cg::test
