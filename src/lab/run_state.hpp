// The lab's internals, shared by its files: one nsqd (broker.cpp), fake-stripe (stripe_double.cpp), the
// consumers under test (unsafe_consumer.cpp, safe_consumer.cpp), the vault proxy of a spend-cap run
// (vault_run.cpp), the run driver (driver.cpp) and the count (count.cpp). Main loop only, like the lab.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "billing/flow/charge_flow.hpp"
#include "http/client.hpp"
#include "http/server.hpp"
#include "lab/lab.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "nsq/consumer.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"
#include "vault/proxy.hpp"

namespace cg::lab {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using sclock = std::chrono::steady_clock;

inline const std::string key_namespace = "lab";
inline const std::string channel_name = "lab";
inline const std::string billing_period = "2026-11";
inline constexpr auto stripe_day = std::chrono::hours(25);  // past Stripe's 24 h idempotency window
inline const std::string stripe_key = "sk_test_chargeguard_lab";

// A step the run cannot go on without: its value, or an exception that ends the lab saying what and why.
template <typename T>
T need(result<T> r, const std::string& what) {
    if (!r) throw std::runtime_error(what + ": " + r.err().describe());
    return std::move(*r);
}
inline void need(result<void> r, const std::string& what) {
    if (!r) throw std::runtime_error(what + ": " + r.err().describe());
}

// --- the run's events (driver.cpp) ------------------------------------------------------------------------

// Event `i` (1-based) of `s`: customer cust-i, Stripe customer cus_labi, 1000 + i cents of the lab's period.
std::string event_body(const scenario& s, int i);
std::string correction_body(const scenario& s, int i);
std::string stripe_customer(int i);
std::string_view name_of(variant w);
// The run's topic: the scenario's name (made safe for nsqd) and the variant.
std::string topic_for(const scenario& s, variant w);

// The consumer's delays in the lab, short so the whole table runs in minutes: reconnects, requeues, handler
// backoff, RDY redistribution, drain and connect (driver.cpp).
void lab_consumer_delays(nsq::consumer_config& c);

// --- one nsqd (broker.cpp) --------------------------------------------------------------------------------

struct lab::broker {
    bool real = false;
    child proc;
    std::string tcp_address, http_address, data_dir;
    sclock::time_point started;
    std::unique_ptr<http::client> http;
};

struct channel_stats {
    bool found = false;
    std::int64_t topic_depth = 0, depth = 0, in_flight = 0, deferred = 0, timeouts = 0;
    bool quiet() const { return topic_depth == 0 && depth == 0 && in_flight == 0 && deferred == 0; }
};

// The body of a 200 answer from nsqd's or fake-stripe's HTTP API; anything else is an error.
result<std::string> body_of(http::client_result res);
net::awaitable<result<std::string>> http_call(http::client& c, std::string method, std::string target,
                                              std::string body);
// The run's channel on `b` (not found: all zeros).
net::awaitable<channel_stats> stats_of(lab::broker& b, const std::string& topic);
// Blocking work for the offload pool: spawn `argv` (stderr to `err_path`) and, with `line`, read its first
// line of stdout.
net::awaitable<std::optional<child>> spawn_and_wait_line(std::vector<std::string> argv, std::string err_path,
                                                         std::string* line);
net::awaitable<int> stop_child(child c, int sig);

// --- fake-stripe (stripe_double.cpp) ----------------------------------------------------------------------

// The lab's Stripe clients: to fake-stripe with the "real" key, or to the vault proxy with a vault key.
stripe::client_config stripe_config(std::string base, std::string key, std::string ca_file);

// --- one variant's state (main loop) ----------------------------------------------------------------------

// The vault proxy of one run, as `chargeguard proxy` runs it, and the key it was issued. Members are
// destroyed in reverse: the caller's client, the listener, the proxy, then what the proxy refers to.
struct lab::vault_run {
    std::shared_ptr<pg::pool> pool;
    metrics::registry reg;
    std::unique_ptr<vault::proxy> proxy;
    std::unique_ptr<http::server> server;
    std::unique_ptr<stripe::client> client;  // the consumer's: the vault secret as its Stripe key
    std::string key_id;
    row::vault_figures fig;
};

struct lab::variant_run {
    variant_run(lab* l, const scenario* s, bool sf, asio::any_io_executor ex)
        : L(l), sc(s), safe(sf), park(ex, sclock::time_point::max()) {}
    ~variant_run() = default;

    lab* L;
    const scenario* sc;
    bool safe;
    stripe::client* stripe = nullptr;  // fake-stripe, or the vault proxy (vault set)
    std::unique_ptr<vault_run> vault;
    std::string topic;
    bool real = false;         // the real nsqd
    bool two_brokers = false;  // FM2b on fake-nsqd: the event reaches a second nsqd
    std::string data_dir;
    std::vector<std::string> bodies;
    std::vector<std::unique_ptr<broker>> brokers;
    std::unique_ptr<metrics::registry> reg = std::make_unique<metrics::registry>();
    std::unique_ptr<billing::charge_flow> pipeline;
    std::unique_ptr<nsq::consumer> consumer;
    nsq::consumer_config ncfg;
    std::string conn_uuid = random_uuid();
    int crashes_left = 0;
    bool crash_pending = false;
    bool clock_jumped = false;
    std::chrono::seconds clock_offset{0};
    net::steady_timer park;  // crashed handlers wait here until their consumer is torn down
    std::set<std::string> keys;
    int running = 0;  // handlers of this run's consumers (current or crashed) not yet returned
    std::uint64_t received = 0, fin_failed = 0, timeouts = 0, disconnects = 0;

    void snapshot_consumer() {
        if (!consumer) return;
        received += consumer->stats().received;
        fin_failed += consumer->stats().fin_failed;
    }
};

using run_t = lab::variant_run;
// Whether the scenario's crashes hit the delivery of `body` (a correction scenario crashes corrections only).
bool crash_applies(const run_t* v, std::string_view body);

// Counts a handler as running for its whole life, so a run ends only once every handler — including those
// of a crashed consumer — has returned and nothing refers to the run any more.
struct running_guard {
    explicit running_guard(run_t* r) : v(r) { ++v->running; }
    ~running_guard() { --v->running; }
    running_guard(const running_guard&) = delete;
    running_guard& operator=(const running_guard&) = delete;
    run_t* v;
};

// nsqd's timeout counts for the run's topic, added up before a broker goes away (broker.cpp).
net::awaitable<void> add_timeouts(run_t& v);

// --- the consumers under test -----------------------------------------------------------------------------

// "Crash after Stripe answered, before FIN" and the deferred-REQ scenario's clock jump, as both consumers
// meet them (unsafe_consumer.cpp).
net::awaitable<bool> maybe_crash(run_t* v);
net::awaitable<void> after_delivery(run_t* v);
// The unsafe consumer's handlers (unsafe_consumer.cpp).
net::awaitable<nsq::disposition> unsafe_handle(run_t* v, nsq::message& m);
net::awaitable<nsq::disposition> unsafe_give_up(nsq::message&);
// The safe consumer's: the pipeline, as `consume` runs it (safe_consumer.cpp).
net::awaitable<nsq::disposition> safe_handle(run_t* v, nsq::message& m);
net::awaitable<nsq::disposition> safe_give_up(run_t* v, nsq::message& m);
billing::charge_flow_config pipeline_config_for(run_t* v);
// The pipeline's timings in the lab (leases of seconds, requeues of a fraction of one) under the key
// namespace `ns`: what every lab run that charges through the pipeline uses (safe_consumer.cpp).
billing::charge_flow_config lab_pipeline_config(std::string ns);
// A new consumer for the run's brokers, with the variant's handlers (safe_consumer.cpp).
void start_consumer(run_t* v, const logger& log);
// Every delivery received has been answered (FIN, REQ or dropped with its connection).
bool consumer_idle(const run_t& v);

}  // namespace cg::lab
