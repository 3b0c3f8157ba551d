// Name resolution that honours a deadline.
//
// Asio resolves with getaddrinfo on a private thread, which nothing can interrupt, and (Asio 1.22) its
// resolver ignores per-operation cancellation: awaited directly, a hung DNS lookup holds the caller past
// any `op || timer` timeout, and so past a connect or whole-request deadline. resolve() stops waiting at
// its deadline, or as soon as the awaiting coroutine is cancelled (an enclosing `||`); the lookup then
// finishes in the background and its answer is dropped. Numeric addresses resolve at once (getaddrinfo
// does no lookup for them). Call it on a single-threaded executor or a strand.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "core/result.hpp"
#include "net/tokens.hpp"

namespace cg::net {

using resolve_results = tcp::resolver::results_type;
using resolve_handler = std::function<void(std::error_code, resolve_results)>;
// Starts a lookup on the given resolver (which runs on the caller's executor); calls the handler once.
using resolve_initiator = std::function<void(tcp::resolver&, resolve_handler)>;

// host and service as for getaddrinfo. Errors: errc::timeout after `timeout`; errc::resolve_failed for an
// empty answer; the resolver's own code otherwise. Messages name the host.
awaitable<result<resolve_results>> resolve(std::string host, std::string service,
                                           std::chrono::steady_clock::duration timeout);

// The same wait around any lookup: the seam tests use to stand in a lookup that hangs.
awaitable<result<resolve_results>> resolve_with(resolve_initiator start, std::string what,
                                                std::chrono::steady_clock::duration timeout);

}  // namespace cg::net
