// The spend-cap proxy: a Stripe-compatible surface for the endpoints a vault key may call. Per request it
// authenticates the vault key, checks the key's allow list, and for a create (POST /v1/charges,
// POST /v1/payment_intents) reserves the amount in one atomic step (vault::store::step) before forwarding
// it with the real key; the answer goes back as Stripe gave it and settles, releases or leaves the
// reservation uncertain — after the answer has gone back (settled: one statement for every key; released or
// uncertain: with the key's next reservation batch), so one round trip per batch is on the critical path. A
// background resolver settles uncertain rows by replaying them under the same Idempotency-Key (inside
// Stripe's window) or by searching the customer's charges for the proxy's metadata tag. Every request writes
// one audit row (batched, written in the background).
//
// Executors: the handler, the store calls, the resolver and the audit writer run on the main executor (the
// pool's); the upstream HTTPS pool (unless proxy_config::upstream_on_main) and the resolver's Stripe client
// run on the offload executor and their results come back to the main loop. The real key lives
// only in `config::upstream_key` and the two clients' request headers: never in a response, a log line or an
// audit row.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "core/log.hpp"
#include "core/result.hpp"
#include "http/client.hpp"
#include "http/proto/message.hpp"
#include "http/router.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"
#include "vault/policy.hpp"
#include "vault/store.hpp"

namespace cg::vault {

struct proxy_config {
    std::string upstream = "https://api.stripe.com";
    std::string upstream_key;          // the real Stripe key (sk_…/rk_…)
    std::string ca_file;               // PEM bundle for the upstream; empty: system store
    std::size_t max_connections = 64;  // to the upstream, over all clients
    std::size_t upstream_clients = 2;  // HTTPS clients (one strand each) sharing the forwarded requests
    // Forwarded requests run their HTTPS on the offload pool (default, docs/design.md §2) or on the main
    // loop. The main loop saves two cross-thread wake-ups per request (less CPU per request;
    // docs/benchmarks/proxy.md) and blocks nothing (pooled keep-alive connections, asynchronous handshakes),
    // but does the record encryption.
    bool upstream_on_main = false;
    std::chrono::milliseconds connect_timeout{5000};
    std::chrono::milliseconds request_timeout{30000};
    // Requests going on to the reservation and the upstream at once; past it a checked request waits for a
    // place, oldest first, within its request_timeout (which counts from the start of that wait and covers
    // the pool wait and the exchange after it), else is answered 502 with Stripe-Should-Retry: true and
    // nothing reserved or sent. Each request past this point holds a reservation, a tagged body and the
    // HTTP client's state (~17 KiB with a 4 KiB body); one waiting holds its request and ~1 KiB. 0: twice
    // max_connections (room for a reservation batch behind every busy connection).
    std::size_t max_forwarding = 0;
    std::size_t max_body_bytes = 64 * 1024;  // larger create bodies → 413
    // A retry under a key first used longer ago than this is refused (Stripe may have pruned the key).
    std::chrono::seconds same_key_window{23 * 3600};
    // The resolver re-sends an uncertain row's request under its Idempotency-Key only while the row is
    // younger than this (and same_key_window); after it, it searches Stripe for the row instead. A replay
    // executes a request Stripe never saved, so it must not come after the client may have given the key up:
    // consume searches and charges under a new key generation once no call under the old one has shown life
    // for --new-key-quiet, and the proxy's replay is a call consume does not see. Half of consume's default
    // quiet period leaves the replay's own exchange and a stall at Stripe inside it.
    std::chrono::seconds replay_window{150};
    // Resolver: how often it looks, how many rows per look, after how long a `reserved` row counts as
    // abandoned, the first delay after a row becomes uncertain, and the longest backoff between attempts.
    std::chrono::milliseconds resolve_interval{5000};
    int resolve_batch = 50;
    std::chrono::milliseconds stale_reserved{120'000};
    std::chrono::milliseconds first_resolve_delay{5000};
    std::chrono::milliseconds max_resolve_backoff{600'000};
    // Settlements are written after the client has its answer. `settled` (almost every answer; it leaves the
    // committed total as it is) goes `settle_linger` later in one cg_vault_settle_many statement for every
    // key, beside the reservation batches; `released` / `uncertain` go with the key's next reservation batch,
    // or alone once no create of that key has come for `settle_linger`. At most `settlement_queue_limit` wait
    // in memory (beyond: the oldest is dropped and its row stays `reserved`, counted, until the resolver
    // takes it up after `stale_reserved`); a batch that fails is retried `settle_attempts` times, then
    // dropped the same way.
    std::chrono::milliseconds settle_linger{2};
    std::size_t settlement_queue_limit = 100'000;
    int settle_attempts = 5;
    // Audit rows are written in batches this often (and at shutdown); at most this many wait in memory.
    std::chrono::milliseconds audit_flush_interval{50};
    std::size_t audit_queue_limit = 100'000;
    // Gauges (cap utilisation per key, reservations by state) are refreshed this often.
    std::chrono::milliseconds gauge_interval{5000};
    // The upstream readiness probe (DNS + TCP + TLS handshake) runs this often.
    std::chrono::milliseconds upstream_probe_interval{10'000};
    std::string stripe_version = "2024-06-20";  // the resolver's requests (clients send their own)
    // A key's row (hash, currency, allow list, revocation) is reused for this long before it is read again.
    // Creates are unaffected: cg_vault_step re-checks revocation and expiry under the key's lock, so a
    // revoked key cannot spend even inside the TTL; a create also takes an older cached row and has it
    // re-read in the background (it never waits for a key read once the key was seen). A read (GET) may pass
    // for up to the TTL after a revoke, and waits for the re-read past it. Zero: every request reads the row.
    std::chrono::milliseconds key_cache_ttl{1000};
    // Cap leases (docs/design.md §5, "Cap leases"): once a key has had `lease_min_creates` creates here
    // within one `lease_pace_window`, this proxy takes a lease of the key's free room sized to `cap_lease`
    // of that pace (at most an eighth of the free room; none near the cap) and spends it in memory — a create
    // it covers is forwarded without a PostgreSQL round trip, and its row is written just after, batched. The
    // lease is topped up when half of it is spent, renewed to expire `lease_ttl` later, and given back once
    // nothing has been spent from it for half of `lease_ttl` (and at stop). A create it cannot cover takes
    // the key's reservation batch as without leases. Zero `cap_lease`: no leases.
    std::chrono::milliseconds cap_lease{2000};
    std::chrono::milliseconds lease_pace_window{1000};
    int lease_min_creates = 10;
    std::chrono::milliseconds lease_ttl{30'000};
};

class proxy {
  public:
    // Builds the upstream clients (TLS context with verification). `pool` and `reg` must outlive the proxy.
    static result<std::unique_ptr<proxy>> create(asio::any_io_executor main, asio::any_io_executor offload,
                                                 proxy_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                                                 metrics::registry& reg);
    ~proxy();
    proxy(const proxy&) = delete;
    proxy& operator=(const proxy&) = delete;

    // Routes for the proxy's listener: everything goes to handle().
    http::router routes();
    // Answers one request (never throws for client, database or upstream failures). Runs on the main
    // executor; `req` must outlive the call.
    net::awaitable<http::response> handle(http::request& req);

    // Starts the resolver, the audit writer, the gauge refresher and the upstream probe on the main executor.
    void start();
    // Stops the background tasks and writes the audit rows still queued (bounded by the pool's timeouts).
    net::awaitable<void> stop();

    // Readiness check "upstream": the last probe's result.
    void add_readiness(metrics::health& h);
    // Whether any upstream probe has succeeded since start() (for the startup endpoint). Thread-safe.
    bool upstream_reached_once() const;

    // One pass of the resolver (tests drive it directly). Returns rows looked at.
    net::awaitable<std::size_t> resolve_once();
    // Writes the queued settlements now (every key). Returns false if PostgreSQL refused some of them
    // (they stay queued, within settle_attempts).
    net::awaitable<bool> flush_settlements();
    // Writes the queued audit rows now. Returns false if PostgreSQL refused (they stay queued).
    net::awaitable<bool> flush_audit();

    struct state;

  private:
    explicit proxy(std::shared_ptr<state> st);
    std::shared_ptr<state> st_;
};

}  // namespace cg::vault
