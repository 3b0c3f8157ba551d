// The runtime flags every service shares (app/cli.hpp): the health listener (address, TLS, basic auth), the
// offload threads, the drain on SIGTERM and the event loop's lag probe and turn budget; their runtime options
// and their part of the effective configuration.
#include <CLI/CLI.hpp>
#include <asio/ip/address.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include "app/cli.hpp"
#include "app/effective_config.hpp"
#include "app/health_auth.hpp"
#include "app/runtime.hpp"
#include "net/address.hpp"
#include "net/tls.hpp"

namespace cg::app {

void add_runtime_flags(CLI::App& cmd, runtime_flags& f) {
    cmd.add_option("--health-listen", f.health_listen, "address for /healthz, /readyz, /metrics")
        ->capture_default_str()
        ->group(group_runtime);
    cmd.add_option("--offload-threads", f.offload_threads, "threads for blocking and Stripe work")
        ->check(CLI::Range(1u, 64u))
        ->capture_default_str()
        ->group(group_runtime);
    add_duration_option(cmd, "--shutdown-timeout", f.shutdown_timeout_s,
                        "how long to drain on SIGTERM before giving up", 0.0, 3600.0)
        ->group(group_runtime);
    add_duration_option(cmd, "--max-loop-lag", f.max_loop_lag_s, "event-loop lag above which /healthz fails",
                        0.001, 60.0)
        ->group(group_runtime);
    add_duration_option(
        cmd, "--loop-lag-interval", f.loop_lag_interval_s,
        "time between the event-loop lag probe's samples (chargeguard_event_loop_lag_seconds); "
        "shorter gives a lag p99 from more samples, at one timer turn per sample",
        0.001, 10.0)
        ->group(group_runtime);
    add_duration_option(
        cmd, "--loop-turn-budget", f.loop_turn_budget_s,
        "how long a turn of the event loop runs deliveries' steps before the rest wait for the "
        "next turn, behind sockets and timers (bounds the loop's lag under load; 0 = unbounded)",
        0.0, 0.1)
        ->group(group_runtime);
    cmd.add_option("--health-tls-cert-file", f.health_tls_cert_file,
                   "PEM certificate chain: serve the health listener over HTTPS (with --health-tls-key-file)")
        ->group(group_runtime);
    cmd.add_option("--health-tls-key-file", f.health_tls_key_file,
                   "PEM private key for --health-tls-cert-file")
        ->group(group_runtime);
    cmd.add_option("--health-basic-auth-file", f.health_basic_auth_file,
                   "file of user:hash lines (bcrypt, yescrypt or SHA-crypt, e.g. `htpasswd -nB USER`): "
                   "/metrics and /config then need basic-auth credentials; /healthz, /readyz and "
                   "/startupz stay open")
        ->group(group_runtime);
    // An acknowledgement: never from the environment.
    env(cmd.add_flag("--health-basic-auth-over-http", f.health_basic_auth_over_http,
                     "allow --health-basic-auth-file on a non-loopback --health-listen without TLS (only "
                     "behind something that terminates TLS: the password otherwise crosses in clear text)")
            ->group(group_runtime),
        env_scope::never);
}

namespace {
std::chrono::steady_clock::duration from_seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

runtime_options to_runtime_options(const runtime_flags& f) {
    runtime_options o;
    auto hp = net::parse_host_port(f.health_listen);
    if (!hp) bad_value("--health-listen", f.health_listen, hp.err().code.message());
    o.health_listen = *hp;
    o.offload_threads = f.offload_threads;
    o.shutdown_timeout = from_seconds(f.shutdown_timeout_s);
    o.max_loop_lag = from_seconds(f.max_loop_lag_s);
    o.lag_interval = from_seconds(f.loop_lag_interval_s);
    o.turn_budget = std::chrono::microseconds(std::llround(f.loop_turn_budget_s * 1e6));
    if (f.health_tls_cert_file.empty() != f.health_tls_key_file.empty())
        throw usage_error("--health-tls-cert-file and --health-tls-key-file go together");
    if (!f.health_tls_cert_file.empty()) {
        auto tls = net::make_tls_server_context({f.health_tls_cert_file, f.health_tls_key_file});
        if (!tls) throw config_error("--health-tls-cert-file/--health-tls-key-file: " + tls.err().message);
        o.health_tls = *tls;
    }
    if (!f.health_basic_auth_file.empty()) {
        auto auth = health_auth::load(f.health_basic_auth_file);
        if (!auth) throw config_error("--health-basic-auth-file: " + auth.err().message);
        o.health_basic_auth = *auth;
        std::error_code ec;
        auto a = asio::ip::make_address(hp->host, ec);
        bool loopback = !ec && a.is_loopback();
        // 64 from the command line, 78 from CHARGEGUARD_HEALTH_BASIC_AUTH_FILE (bad_value).
        if (!o.health_tls && !loopback && !f.health_basic_auth_over_http)
            bad_value(
                "--health-basic-auth-file", f.health_basic_auth_file,
                "basic auth on --health-listen " + f.health_listen +
                    " (not loopback) without --health-tls-cert-file: the password would cross the network "
                    "in clear text. Give the TLS files, or --health-basic-auth-over-http when a proxy in "
                    "front terminates TLS");
    }
    return o;
}

void add_runtime_settings(effective_config& c, const runtime_flags& f, const runtime_options& o) {
    c.add("health_listen", f.health_listen)
        .add("health_tls", o.health_tls != nullptr)
        .add("health_tls_cert_file", f.health_tls_cert_file)
        .add("health_basic_auth_file", f.health_basic_auth_file)
        .add("health_basic_auth_users", o.health_basic_auth ? o.health_basic_auth->users() : std::size_t{0})
        .add("offload_threads", o.offload_threads)
        .add("shutdown_timeout_s", f.shutdown_timeout_s)
        .add("max_loop_lag_s", f.max_loop_lag_s)
        .add("loop_lag_interval_s", f.loop_lag_interval_s)
        .add("loop_turn_budget_us", static_cast<std::int64_t>(o.turn_budget.count()));
}

}  // namespace cg::app
