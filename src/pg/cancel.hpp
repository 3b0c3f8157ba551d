// Cancel requests, kept off every shared executor.
//
// libpq 15's PQcancel is blocking with no timeout: it connects to the postmaster, sends the CancelRequest and
// waits for the postmaster to close the socket. With the server's host black-holed (a partition) the connect
// hangs for the kernel's SYN retries (minutes); with a stalled postmaster the wait for EOF never ends. Run on
// the offload pool, two such cancels pinned both threads and starved the Stripe client's calls and timers.
//
// Why a dedicated runner and not the alternatives:
//  * sending the CancelRequest ourselves (non-blocking, with a deadline) needs the backend's secret key,
//    which libpq 15 does not expose (PGcancel is opaque; PQcancelStart arrives in libpq 17);
//  * pg_cancel_backend() over another pooled connection needs a working connection to the same server —
//    exactly what a partition takes away — and a free pool slot when the pool is exhausted.
// So each cancel runs PQcancel on its own short-lived thread, and at most max_cancels_in_flight run at once:
// a cancel that hangs costs one parked thread, never a shared executor's thread, and beyond the bound a new
// cancel is skipped (logged). Skipping is safe: the connection of a cancelled statement is never reused
// (connection.hpp), and lease-extending statements carry their own database-checked deadline (billing
// ledger), so an unsent cancel delays only the server's cleanup of a statement nobody waits for.
// The caller never waits for the runner: it waits for the statement's own end up to cancel_grace.
#pragma once

#include <cstddef>

#include "core/log.hpp"

struct pg_cancel;  // libpq's PGcancel

namespace cg::pg {

inline constexpr std::size_t max_cancels_in_flight = 4;

// Takes ownership of `c` (from PQgetCancel; freed on every path) and sends the cancel request on a dedicated
// thread. Returns false when the request was skipped because max_cancels_in_flight are still running. Never
// blocks; callable from any thread.
bool send_cancel_request(pg_cancel* c, const logger& log);

// Cancel requests started and not finished yet (blocked on an unreachable server, typically).
std::size_t cancels_in_flight() noexcept;

}  // namespace cg::pg
