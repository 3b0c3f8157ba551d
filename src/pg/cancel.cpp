#include "pg/cancel.hpp"

#include <libpq-fe.h>

#include <atomic>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

namespace cg::pg {
namespace {

// Process-wide: the bound is about threads parked in the kernel, whichever pool or connection asked.
std::atomic<std::size_t> in_flight{0};

struct cancel_deleter {
    void operator()(PGcancel* c) const noexcept { PQfreeCancel(c); }
};

// Runs on its own thread; owns everything it touches (the PGcancel and a copy of the logger), so a detached
// thread still blocked at process exit touches no state that exit destroys except the counter (trivial).
void run_cancel(std::unique_ptr<PGcancel, cancel_deleter> c, logger log) {
    char buf[256] = {0};
    if (!PQcancel(c.get(), buf, sizeof buf))
        log.info("PostgreSQL cancel request failed", {{"error", std::string(buf)}});
    c.reset();
    in_flight.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace

bool send_cancel_request(pg_cancel* raw, const logger& log) {
    std::unique_ptr<PGcancel, cancel_deleter> c(raw);
    if (!c) return false;
    auto n = in_flight.load(std::memory_order_acquire);
    do {
        if (n >= max_cancels_in_flight) {
            log.warn("PostgreSQL cancel request skipped: earlier ones are still waiting for the server",
                     {{"in_flight", n}});
            return false;
        }
    } while (!in_flight.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel));
    try {
        // Detached: nobody joins a thread that may stay blocked in connect()/recv() for minutes; it ends on
        // its own when the kernel gives up, or with the process.
        std::thread(run_cancel, std::move(c), log).detach();
    } catch (const std::system_error& e) {
        in_flight.fetch_sub(1, std::memory_order_acq_rel);
        log.warn("PostgreSQL cancel request skipped: no thread", {{"error", e.what()}});
        return false;
    }
    return true;
}

std::size_t cancels_in_flight() noexcept {
    return in_flight.load(std::memory_order_acquire);
}

}  // namespace cg::pg
