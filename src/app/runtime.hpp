// The process runtime shared by long-running subcommands: the main io_context (one thread), the offload
// pool, logger, metrics, health server, event-loop lag probe, and signal-driven bounded shutdown.
#pragma once

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "app/effective_config.hpp"
#include "app/health_auth.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "http/router.hpp"
#include "http/server.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "metrics/startup.hpp"
#include "net/address.hpp"
#include "net/lag_probe.hpp"
#include "net/offload.hpp"

namespace cg::app {

// The exit status after a drain that SIGHUP started (128 + SIGHUP): non-zero, so a supervisor restarting on
// failure starts the service again with its new configuration.
inline constexpr int exit_hangup = 129;

struct runtime_options {
    net::host_port health_listen{"127.0.0.1", 9180};
    unsigned offload_threads = 2;
    std::chrono::steady_clock::duration shutdown_timeout = std::chrono::seconds(30);
    // /healthz fails when the loop was late by more than this within the window.
    std::chrono::steady_clock::duration max_loop_lag = std::chrono::milliseconds(200);
    std::chrono::steady_clock::duration lag_window = std::chrono::seconds(10);
    std::chrono::steady_clock::duration lag_interval = std::chrono::milliseconds(50);
    // How long one turn of the loop runs deliveries' steps before the rest go behind I/O
    // (net/turn_budget.hpp).
    std::chrono::microseconds turn_budget{500};
    bool handle_signals = true;
    // HTTPS on the health listener when set (--health-tls-cert-file/--health-tls-key-file).
    std::shared_ptr<asio::ssl::context> health_tls;
    // When set, every route but /healthz, /readyz and /startupz (which probes reach without credentials)
    // answers 401 without valid basic-auth credentials (--health-basic-auth-file).
    std::shared_ptr<health_auth> health_basic_auth;
};

class runtime {
  public:
    runtime(runtime_options opts, logger log);
    ~runtime();

    asio::io_context& io() { return io_; }
    net::offload_pool& offload() { return offload_; }
    const logger& log() const { return log_; }
    metrics::registry& metrics() { return metrics_; }
    metrics::health& health() { return health_; }
    // /startupz: register the conditions before start() (none registered: started at once).
    metrics::startup& startup() { return startup_; }
    // Extra routes for the health server; add them before start().
    http::router& routes() { return routes_; }
    // GET /config on the health listener: this configuration as JSON (the same list the startup line
    // logs). Call before start().
    // Off loopback without basic auth, the addresses in it are redacted (effective_config::add_address).
    void set_effective_config(const effective_config& c) {
        config_json_ = c.json();
        config_json_redacted_ = c.json(true);
    }

    // A drain step run on the first signal (or request_stop()); all run concurrently, bounded together by
    // shutdown_timeout. Called on the main executor.
    using drain_fn = std::function<asio::awaitable<void>()>;
    void on_shutdown(drain_fn fn) { drains_.push_back(std::move(fn)); }

    // Starts the lag probe, the health server and the signal handlers (SIGTERM, SIGINT and SIGHUP all drain:
    // a reload would have to swap the Stripe key under requests in flight on other threads; a restart by
    // the supervisor does the same safely). Raises the soft RLIMIT_NOFILE to the hard limit, so a flood of
    // idle connections meets the listeners' own limits, not EMFILE. Returns the bound endpoint.
    result<net::tcp::endpoint> start();
    // Runs the main loop until shutdown completes. Returns the process exit code.
    int run();
    // Begins a graceful shutdown, as SIGTERM would. Call on the main executor. A non-zero `exit_code` makes
    // run() return it (a startup step that failed after the loop started, e.g. --migrate); ignored when a
    // shutdown is already under way.
    void request_stop(std::string_view reason, int exit_code = 0);
    bool stopping() const { return stopping_; }
    // Runs a startup step (migrations, first connections, then the work itself) on the main loop after
    // start(). A step that throws is logged as "startup failed" and stops the process with exit code 1.
    void spawn_startup(asio::awaitable<void> step);
    // A service's main: start(), then spawn_startup(`startup`) and run(). A start() that fails is logged as
    // "cannot start" and returns exit code 1 (`startup` never runs).
    int start_and_run(asio::awaitable<void> startup);

  private:
    static asio::awaitable<void> shutdown(runtime* self);
    static asio::awaitable<http::response> config(const std::string* json);
    static asio::awaitable<http::response> guarded(runtime* self, http::request& req);
    void wait_signal();

    runtime_options opts_;
    logger log_;
    net::loop_pair loops_;
    net::shutdown_io_context& io_ = loops_.io;
    net::offload_pool& offload_ = loops_.offload;
    metrics::registry metrics_;
    metrics::health health_;
    metrics::startup startup_;
    http::router routes_;
    std::string config_json_, config_json_redacted_;
    std::unique_ptr<http::server> server_;
    std::shared_ptr<net::lag_probe> probe_;
    asio::signal_set signals_;
    std::vector<drain_fn> drains_;
    bool stopping_ = false;
    int exit_code_ = 0;
};

}  // namespace cg::app
