// stripe::client's state and the path every call takes (client_call.cpp): the retry loop on the http
// client's strand, the metrics around a logical call, the hand-off to the strand and the bound on calls under
// way. Shared by the client's files: client.cpp (reads, lists, searches, raw calls, set-up) and
// client_create.cpp (the creating POSTs). Internal to the stripe module.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "core/log.hpp"
#include "net/admission.hpp"
#include "net/offload.hpp"
#include "net/tokens.hpp"
#include "stripe/client.hpp"
#include "stripe/client_metrics.hpp"
#include "stripe/pacer.hpp"

namespace cg::stripe {

struct client::state {
    client_config cfg;
    logger log;
    std::unique_ptr<http::client> http;
    std::unique_ptr<client_metrics> metrics;  // null: no registry given
    std::shared_ptr<pacer> pace;              // null: no rate control
    std::unique_ptr<net::admission> calls;    // null: no bound on logical calls at once (cfg.max_calls)
    // Stripe limits each connected account on its own: one pacer per Stripe-Account, made on first use
    // (only with rate control on). Used only on the http client's strand.
    std::map<std::string, std::shared_ptr<pacer>, std::less<>> account_pace;
    std::mt19937_64 rng{std::random_device{}()};  // jitter; used only on the http client's strand
};

namespace client_detail {

using state_ptr = std::shared_ptr<client::state>;
using steady = std::chrono::steady_clock;

// Start of a logical call, on the strand: the connection figures catch up and the clock starts.
steady::time_point begin_call(const client::state& st);
// End of a logical call (after its retries), on the strand.
void end_call(const client::state& st, operation op, outcome_class cls, steady::time_point start);

// The retry loop. Runs on the http client's strand. Counts attempts, retries and replays under `op`.
net::awaitable<call_result> run_call(state_ptr st, operation op, std::string method, std::string target,
                                     std::string body, std::string key, std::string account);

// Runs `a` on the client's strand and resumes the caller on its own executor.
template <typename T>
net::awaitable<T> on_strand(state_ptr st, net::awaitable<T> a) {
    // The hand-off (net/offload.hpp): the caller's cancellation stays on the caller's thread.
    co_return co_await net::offload(st->http->get_executor(), std::move(a));
}

// A place among cfg.max_calls logical calls, taken before the call builds anything (its request, its
// coroutines on the strand, a pool slot): callers beyond the bound wait here holding only their own frame.
net::awaitable<net::admission::ticket> admit(client::state& st);

}  // namespace client_detail
}  // namespace cg::stripe
