// proxy::state and the proxy's internal interfaces, shared by its files: proxy.cpp (the request path),
// request_checks.cpp (what a request must be before it goes on), forward_places.cpp (the bound on requests
// going on), refusals.cpp (the answers it makes itself), key_cache.cpp, reservation_batcher.cpp (per-key
// cg_vault_step batches), settlement_queue.cpp (what Stripe answered, written after the answer went back),
// proxy_metrics.cpp, background.cpp (audit writer, gauges, upstream probe) and resolver.cpp. Internal to the
// vault module. Main executor only, except where a member says otherwise.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "net/tokens.hpp"
#include "vault/proxy.hpp"

namespace cg::vault {

struct forward_waiter;  // forward_places.cpp

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
    metrics::family<metrics::Gauge>* lease_cents = nullptr;    // per key: what this proxy may still spend
    metrics::family<metrics::Counter>* lease_takes = nullptr;  // by result
    metrics::Counter* lease_returned_cents = nullptr;
    metrics::Counter* leases_stranded = nullptr;
    metrics::Gauge* expired_lease_cents = nullptr;  // ledger-wide

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
    // Requests that passed their checks and go on to the reservation and the upstream: at most
    // `forwarding_capacity` at once (proxy_config::max_forwarding); the others wait in `forward_waiters`,
    // oldest first, each holding only its request and a small frame, until a place comes free or their
    // upstream deadline passes (proxy.cpp).
    std::size_t forwarding = 0;
    std::size_t forwarding_capacity = 1;
    std::deque<forward_waiter*> forward_waiters;
    struct cached_key {
        key_record key;
        std::chrono::steady_clock::time_point fetched;
    };
    std::unordered_map<std::string, cached_key> keys;  // by id; only keys that exist
    std::set<std::string> keys_refreshing;             // ids whose row is being re-read in the background
    // Reads of a key's row in flight for requests that found no usable cached row: a request for the same
    // key meanwhile waits for that read's answer instead of sending its own (a burst on a cold cache makes
    // one read per key, not one per request).
    struct key_read {
        std::optional<result<std::optional<key_record>>> out;
        std::vector<net::steady_timer*> waiters;
    };
    std::unordered_map<std::string, std::shared_ptr<key_read>> key_reads;
    // Per key: creates waiting for the next cg_vault_step batch, and the settlements (answers already sent
    // to clients) that go with it (see drain_key in reservation_batcher.cpp). One drain per key at a time.
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
    // reservation batches instead of inside them (see drain_quick_settlements in settlement_queue.cpp).
    std::deque<store::keyed_settlement> quick_settlements;
    bool quick_draining = false;
    net::steady_timer* quick_linger = nullptr;
    int quick_failures = 0;
    std::size_t settlements_pending = 0;          // queued or in a batch in flight, every key
    int flushing = 0;                             // flush_settlements() callers waiting
    std::set<net::steady_timer*> settle_waiters;  // woken after every batch
    std::uint64_t settle_failures = 0;            // batches with settlements that failed

    // Cap leases (cap_lease.cpp), per key: what this proxy may spend without PostgreSQL, and the spends
    // whose rows are still to be written.
    struct lease_spend {
        reserve_request req;                        // its row, as a reservation would write it
        std::optional<reserve_result> recorded;     // the row's outcome, once written
        std::optional<http::client_result> answer;  // Stripe's answer, when it came before the row
    };
    struct key_lease {
        std::int64_t id = 0;                                  // 0: none held
        std::int64_t remaining = 0;                           // cents this proxy may still spend from it
        std::chrono::steady_clock::time_point spend_until{};  // its expiry by this clock, early
        std::chrono::steady_clock::time_point last_spend{};
        bool taking = false, recording = false, returning = false;
        // A record given up (PostgreSQL gone at stop): spends may be unwritten, so the lease is never given
        // back — what it holds stays counted.
        bool stranded = false;
        int record_failures = 0;
        std::deque<std::shared_ptr<lease_spend>> unrecorded;
        // The key's pace of creates here: the current window and the last whole one.
        std::chrono::steady_clock::time_point window_start{}, last_end{};
        std::int64_t window_creates = 0, window_cents = 0, last_creates = 0, last_cents = 0;
        std::int64_t max_amount = 0;
        metrics::Gauge* gauge = nullptr;  // chargeguard_vault_lease_cents{key}, once the key has had a lease
    };
    std::unordered_map<std::string, key_lease> leases;  // by key id
    std::string lease_holder;                           // this process, as vault_leases.holder names it
    std::size_t lease_records_pending = 0;              // spends not yet written, every key

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

using state_ptr = std::shared_ptr<proxy::state>;

// Sleeps on the main executor; stop() wakes every sleeper. Returns false when woken by stop().
net::awaitable<bool> nap(std::shared_ptr<proxy::state> st, std::chrono::steady_clock::duration d);

// What one request came to, filled in as the handler goes and written as its audit row.
struct ledger_line {
    using clock = std::chrono::steady_clock;
    audit_row row;
    clock::time_point started = clock::now();
    double upstream_seconds = 0;
    // Stage boundaries of a forwarded create (zero where the request did not get that far): key checked,
    // queued for its reservation batch, that batch's statement sent and answered, forwarded, Stripe answered.
    clock::time_point authed, queued, stmt_sent, stmt_done, up_sent, up_done;
    std::size_t batch_creates = 0, batch_settlements = 0;
};

// --- proxy.cpp: the request path ---------------------------------------------------------------------------

// Ends the request: counts the outcome, queues the audit row, observes the latencies.
http::response finish(proxy::state& st, ledger_line& l, std::string outcome, http::response resp);
// PostgreSQL could not be asked: logged, refused as vault_unavailable, nothing forwarded.
http::response unavailable(proxy::state& st, ledger_line& l, const error& e);
// The connection's socket can no longer be read (the listener's stop closed it) with the request's body still
// in it: nothing was reserved or sent, as for a request that found no place in time.
http::response client_gone(proxy::state& st, ledger_line& l, bool creates);

// --- request_checks.cpp ------------------------------------------------------------------------------------

// What a request that passed every check made before forwarding goes on with.
struct checked {
    operation op;
    std::string key_id, key_currency;  // the key's, not its whole row: a waiting request holds this
    create_params create;              // a create's parameters
};

// Every check that needs neither a reservation nor the upstream: the path, the key and its scope, and for a
// write its Idempotency-Key and body. The refusal (finished), or nullopt with `c` filled when the request
// goes on.
net::awaitable<std::optional<http::response>> check_request(state_ptr st, http::request& req, ledger_line& l,
                                                            checked& c);

// --- forward_places.cpp ------------------------------------------------------------------------------------

// A place among the requests going on to the reservation and the upstream (proxy_config::max_forwarding).
// Dropping it hands it to the oldest waiter, else frees it.
class forward_place {
  public:
    forward_place() = default;
    explicit forward_place(std::shared_ptr<proxy::state> st) : st_(std::move(st)) {}
    forward_place(forward_place&& o) noexcept = default;
    forward_place& operator=(forward_place&&) = delete;
    forward_place(const forward_place&) = delete;
    forward_place& operator=(const forward_place&) = delete;
    ~forward_place();
    bool held() const noexcept { return st_ != nullptr; }

  private:
    std::shared_ptr<proxy::state> st_;
};

// A place at once when one is free and nobody waits, else the oldest waiter's turn; an empty place when
// `deadline` passed first.
net::awaitable<forward_place> enter_forwarding(state_ptr st, std::chrono::steady_clock::time_point deadline);

// --- refusals.cpp: a refusal as the client gets it ---------------------------------------------------------

// `retry`: Stripe-Should-Retry (the SDKs obey it; absent → their defaults).
http::response refuse(proxy::state& st, const refusal& r, std::optional<bool> retry);
http::response transport_failure(proxy::state& st, const http::client_result& r);

// --- key_cache.cpp -----------------------------------------------------------------------------------------

// The key's row, from the cache under the rule of key_cache.hpp, else read (and cached).
net::awaitable<result<std::optional<key_record>>> find_key(state_ptr st, std::string id, bool creates);
// Returns once the read of `id`'s row in flight (proxy::state::key_reads), if any, has its answer: a burst on
// a cold cache waits here, in a frame far smaller than find_key's, and then finds the row cached.
net::awaitable<void> await_key_read(state_ptr st, std::string id);

// --- reservation_batcher.cpp -------------------------------------------------------------------------------

// The atomic find-or-reserve step for one create, batched with the other creates of its key.
net::awaitable<result<reserve_result>> reserve_batched(state_ptr st, reserve_request rq, ledger_line& l);
// Starts the key's drain unless one runs (then wakes it if it lingers for creates).
void start_drain(state_ptr st, const std::string& key_id);

// --- cap_lease.cpp -----------------------------------------------------------------------------------------

// A create's reservation: from this proxy's lease of the key's cap when it covers the amount (no PostgreSQL
// round trip; `spend` set), else the key's reservation batch.
struct create_reservation {
    result<reserve_result> res = error(core_errc::io_error, "not reserved");
    std::shared_ptr<proxy::state::lease_spend> spend;
};
net::awaitable<create_reservation> reserve_create(state_ptr st, reserve_request rq, ledger_line& l);
// account() for a create's answer; for a lease spend whose row is not written yet, once it is (the audit
// outcome returned is then the owner's).
std::string account_create(const state_ptr& st, const create_reservation& c, const std::string& key_id,
                           const std::string& idem, const http::client_result& r);
// Every lease: renewed while spent, given back once idle (background.cpp runs it).
net::awaitable<void> lease_loop(state_ptr st);
// At stop, after the spends are written: every lease given back.
net::awaitable<void> return_leases(state_ptr st);
// Within the leases (cap_lease.cpp, cap_lease_record.cpp): chargeguard_vault_lease_cents of the key set to
// what this proxy may still spend from its lease; the key's spends written in the background (one writer
// per key, started unless running).
void show_lease(proxy::state& st, const std::string& key, proxy::state::key_lease& kl);
void start_record(const state_ptr& st, const std::string& key);

// --- settlement_queue.cpp ----------------------------------------------------------------------------------

// After a create came back: what happens to the reservation, queued to be written with the key's next batch
// or the next settle-many batch (the client does not wait for it). Returns the audit outcome.
std::string account(const state_ptr& st, const reserve_result& res, const std::string& key_id,
                    const std::string& idem, const http::client_result& r);
void start_quick_drain(state_ptr st);
void wake_settle_waiters(proxy::state& st);
// After a batch carrying `n` settlements failed with `e`: counts it, and either gives the settlements up
// once `failures` (the drain's consecutive failures) reaches settle_attempts — logged and counted as
// dropped: the rows stay `reserved` until the resolver settles them — and returns false, or returns true:
// the caller puts them back at the front, in order, and waits settle_backoff() before the next batch.
// `key_id` empty: the settle-many drain (every key).
bool settlements_retry(proxy::state& st, int& failures, std::size_t n, const std::string& key_id,
                       const error& e);
// The pause before retrying failed settlements, growing with `failures`; none while stopping or flushing.
net::awaitable<void> settle_backoff(state_ptr st, int failures);

// --- background.cpp --------------------------------------------------------------------------------------

// Runs `task` on the main executor, counted in proxy::state::running (stop() waits for it); a failure is
// logged under `name`.
void spawn_logged(state_ptr st, net::awaitable<void> task, const char* name);

// --- resolver.cpp ----------------------------------------------------------------------------------------

// Resolver passes (uncertain and abandoned reservations, then payments in flight) every resolve_interval
// until stop (background.cpp starts it).
net::awaitable<void> resolver_loop(state_ptr st);
// A settled answer whose payment is still in flight (an intent processing or requires_capture, a charge
// pending) is marked for the resolver, which follows it until Stripe says how it ended.
void note_in_flight(state_ptr st, const std::string& key_id, const std::string& idem, std::string_view body);

// --- proxy_metrics.cpp -------------------------------------------------------------------------------------

void register_metrics(proxy::state& st, metrics::registry& reg);
// Per-stage timings of a create that was forwarded: the stage histograms, and one debug line per request
// (the benchmark's --trace-burst reads them to show where a burst's time goes).
void observe_stages(proxy::state& st, const ledger_line& l, std::chrono::steady_clock::time_point end);

}  // namespace cg::vault
