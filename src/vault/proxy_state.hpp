// proxy::state, shared by proxy.cpp (the request handler) and background.cpp (resolver, audit writer,
// gauges, upstream probe). Internal to the vault module.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "net/tokens.hpp"
#include "vault/proxy.hpp"

namespace cg::vault {

struct proxy::state {
    asio::any_io_executor main;
    asio::any_io_executor offload;
    proxy_config cfg;
    std::shared_ptr<pg::pool> pool;
    vault::store store;
    logger log;
    // Forward requests (offload executor), round robin: each client is one strand, so one thread at a time
    // does its TLS; several spread the work over the offload pool.
    std::vector<std::unique_ptr<http::client>> upstreams;
    std::size_t next_upstream = 0;
    std::unique_ptr<stripe::client> stripe;   // the resolver's replays and searches (offload executor)
    std::shared_ptr<asio::ssl::context> tls;  // the upstream probe's context

    // Metrics (owned by the registry).
    metrics::family<metrics::Counter>* requests = nullptr;
    metrics::family<metrics::Counter>* resolutions = nullptr;
    metrics::family<metrics::Gauge>* utilisation = nullptr;
    metrics::family<metrics::Gauge>* reservations = nullptr;
    metrics::Histogram* upstream_latency = nullptr;
    metrics::Histogram* added_latency = nullptr;
    metrics::Histogram *stage_auth = nullptr, *stage_wait = nullptr, *stage_statement = nullptr,
                       *stage_upstream = nullptr, *stage_answer = nullptr;
    metrics::Counter* audit_dropped = nullptr;
    metrics::Counter* audit_written = nullptr;
    metrics::Counter* settlements_dropped = nullptr;

    // Main executor only.
    std::deque<audit_row> audit;
    bool audit_writing = false;                  // a flush has a batch in flight: one writer at a time
    std::set<net::steady_timer*> audit_waiters;  // flushes waiting for it, woken when it ends
    bool stopping = false;
    bool started = false;
    std::set<net::steady_timer*> sleepers;
    int running = 0;                           // background tasks not yet finished
    net::steady_timer* all_stopped = nullptr;  // stop() waits on it until `running` is 0
    std::uint64_t next_request_id = 0;
    struct cached_key {
        key_record key;
        std::chrono::steady_clock::time_point fetched;
    };
    std::unordered_map<std::string, cached_key> keys;  // by id; only keys that exist
    std::set<std::string> keys_refreshing;             // ids whose row is being re-read in the background
    // Per key: creates waiting for the next cg_vault_step batch, and the settlements (answers already sent
    // to clients) that go with it (see drain_key in proxy.cpp). One drain per key at a time.
    struct pending_reserve {
        reserve_request req;
        std::optional<result<reserve_result>> out;
        net::steady_timer* wake = nullptr;
        std::chrono::steady_clock::time_point sent, done;  // the batch's statement
        std::size_t batch_creates = 0, batch_settlements = 0;
    };
    struct key_queue {
        std::deque<pending_reserve*> waiting;
        std::deque<settlement_request> settlements;
        bool draining = false;
        net::steady_timer* linger = nullptr;  // the drain waiting for creates to join its settlements
        int failures = 0;                     // consecutive failed batches that carried settlements
    };
    std::unordered_map<std::string, key_queue> key_queues;  // by key id
    // Settlements that leave the committed total as it is (reserved / uncertain → settled: almost every
    // answer), every key: written by one drain, a cg_vault_settle_many statement per batch, beside the keys'
    // reservation batches instead of inside them (see drain_quick_settlements in proxy.cpp).
    std::deque<store::keyed_settlement> quick_settlements;
    bool quick_draining = false;
    net::steady_timer* quick_linger = nullptr;
    int quick_failures = 0;
    std::size_t settlements_pending = 0;          // queued or in a batch in flight, every key
    int flushing = 0;                             // flush_settlements() callers waiting
    std::set<net::steady_timer*> settle_waiters;  // woken after every batch
    std::uint64_t settle_failures = 0;            // batches with settlements that failed

    // Read by the readiness check from the health server's thread (the same main loop, but keep it simple).
    std::mutex probe_mu;
    bool upstream_ok = false;
    bool upstream_ever_ok = false;
    std::string upstream_detail = "not probed yet";

    state(asio::any_io_executor m, asio::any_io_executor o, proxy_config c, std::shared_ptr<pg::pool> p,
          logger l)
        : main(std::move(m)),
          offload(std::move(o)),
          cfg(std::move(c)),
          pool(p),
          store(std::move(p)),
          log(std::move(l)) {}

    void count(std::string_view outcome) { requests->Add({{"outcome", std::string(outcome)}}).Increment(); }
    void queue_audit(audit_row row);
    // Queues what Stripe answered for a reservation of `key_id`; written with the key's next batch.
    void queue_settlement(const std::string& key_id, settlement_request s);
    // Queues a reservation's `settled` for the next cg_vault_settle_many batch (every key).
    void queue_quick_settlement(const std::string& key_id, settlement_request s);
    // False (and the settlement counted as dropped) when the queue is full.
    bool room_for_settlement(const std::string& key_id, const settlement_request& s);
};

// Sleeps on the main executor; stop() wakes every sleeper. Returns false when woken by stop().
net::awaitable<bool> nap(std::shared_ptr<proxy::state> st, std::chrono::steady_clock::duration d);

}  // namespace cg::vault
