// `chargeguard proxy`: the spend-cap vault proxy (docs/design.md §1). A Stripe-compatible HTTP(S) surface
// on
// --listen for holders of vault keys; the real Stripe key (STRIPE_API_KEY or --stripe-key-file, never argv)
// stays inside. /healthz, /readyz (postgres, upstream) and /metrics on --health-listen.
//
// Executors (docs/design.md §2): the listener, the handlers, the PostgreSQL pool and the proxy's background
// tasks run on the runtime's main io_context; upstream HTTPS runs on the offload pool (--upstream-on-main
// moves the forwarding onto the main loop). SIGTERM: the listener stops, the audit queue is written, the pool
// closes, exit 0.
#include <malloc.h>

#include <asio/co_spawn.hpp>
#include <memory>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/listener_flags.hpp"
#include "app/nsq_flags.hpp"
#include "app/pg_flags.hpp"
#include "app/runtime.hpp"
#include "app/schema_gate.hpp"
#include "app/stripe_flags.hpp"
#include "http/origin.hpp"
#include "http/server.hpp"
#include "vault/proxy.hpp"

namespace cg::app {
namespace {

using std::chrono::milliseconds;

struct proxy_flags {
    std::string listen = "127.0.0.1:8420";
    std::string upstream = "https://api.stripe.com";
    std::string stripe_key_file;
    std::string stripe_ca_file;
    double upstream_connect_timeout_s = 5;
    double upstream_timeout_s = 30;
    unsigned upstream_max_connections = 64;
    unsigned max_forwarding = 0;
    std::size_t max_body_bytes = 64 * 1024;
    listener_flags listener;
    std::string same_key_window = "23h";
    std::string replay_window = "150s";
    std::string resolve_interval = "5s";
    std::string stale_reserved = "2m";
    std::string key_cache_ttl = "1s";
    std::string cap_lease = "2s";
    bool upstream_on_main = false;
    bool allow_insecure_http = false;
    pg_flags pg;
    runtime_flags rt;
};

milliseconds seconds_flag(double s) {
    return milliseconds(static_cast<std::int64_t>(s * 1000.0));
}

vault::proxy_config to_proxy_config(const proxy_flags& f) {
    vault::proxy_config c;
    refuse_plain_http("--upstream", f.upstream, f.allow_insecure_http);
    c.upstream = f.upstream;
    // The proxy holds the real key: a vault key here would be a configuration mix-up.
    c.upstream_key = read_checked_stripe_key(f.stripe_key_file, key_kinds::stripe_only);
    c.ca_file = f.stripe_ca_file;
    c.connect_timeout = seconds_flag(f.upstream_connect_timeout_s);
    c.request_timeout = seconds_flag(f.upstream_timeout_s);
    c.max_connections = f.upstream_max_connections;
    c.max_forwarding = f.max_forwarding;
    c.upstream_clients = f.rt.offload_threads;  // one HTTPS client (strand) per offload thread
    c.upstream_on_main = f.upstream_on_main;
    if (c.upstream_on_main) c.upstream_clients = 1;
    c.max_body_bytes = f.max_body_bytes;
    auto window = duration_flag("--same-key-window", f.same_key_window);
    // Rounded up for the check: 23h plus half a second is over 23h.
    if (auto why = vault::same_key_window_problem(std::chrono::ceil<std::chrono::seconds>(window)))
        throw CLI::ValidationError("--same-key-window", *why + " (got " + f.same_key_window + ")");
    c.same_key_window = std::chrono::duration_cast<std::chrono::seconds>(window);
    auto replay = duration_flag("--replay-window", f.replay_window);
    if (replay < std::chrono::seconds(10) || replay > window)
        throw CLI::ValidationError("--replay-window",
                                   "must be between 10s and --same-key-window, and under "
                                   "consume's --new-key-quiet (got " +
                                       f.replay_window + ")");
    c.replay_window = std::chrono::duration_cast<std::chrono::seconds>(replay);
    c.resolve_interval = duration_flag("--resolve-interval", f.resolve_interval);
    c.first_resolve_delay = c.resolve_interval;
    c.stale_reserved = duration_flag("--stale-reserved", f.stale_reserved);
    c.key_cache_ttl = duration_flag("--key-cache-ttl", f.key_cache_ttl);
    if (c.key_cache_ttl > std::chrono::minutes(1))
        throw CLI::ValidationError("--key-cache-ttl", "at most 1m (a revoked key may read for this long)");
    c.cap_lease = duration_flag("--cap-lease", f.cap_lease);
    if (c.cap_lease > std::chrono::minutes(1))
        throw CLI::ValidationError("--cap-lease",
                                   "at most 1m (a lease is cap room other replicas cannot use)");
    if (c.stale_reserved <= c.request_timeout)
        throw CLI::ValidationError("--stale-reserved",
                                   "must be longer than --upstream-timeout (a row still in flight is "
                                   "not abandoned)");
    return c;
}

// The handler refuses create bodies over --max-body-bytes with a Stripe-shaped, audited 413.
http::server_options to_server_options(const proxy_flags& f) {
    const auto& l = f.listener;
    if (!l.tls_cert.empty() && !l.tls_key.empty()) {
        // Precise messages for a missing, unreadable, empty or non-PEM file before OpenSSL's own.
        auto key = read_secret_file("--tls-key", l.tls_key);
        if (key.find("-----BEGIN") == std::string::npos || key.find("PRIVATE KEY-----") == std::string::npos)
            bad_secret_file("--tls-key", l.tls_key, "not a PEM private key (no BEGIN … PRIVATE KEY line)");
        if (read_secret_file("--tls-cert", l.tls_cert).find("-----BEGIN CERTIFICATE-----") ==
            std::string::npos)
            bad_secret_file("--tls-cert", l.tls_cert, "not a PEM certificate (no BEGIN CERTIFICATE line)");
    }
    return to_listener_options(l, f.max_body_bytes, "chargeguard-vault");
}

// Stop accepting, let the proxy write its audit queue, then close the pool (which the audit writer needed).
net::awaitable<void> drain(http::server* server, vault::proxy* p, std::shared_ptr<pg::pool> pool) {
    server->stop();
    co_await p->stop();
    co_await pool->close();
}

int run_proxy(const proxy_flags& f, const global_flags& g) {
    // One malloc arena for every thread: the upstream clients' threads' own arenas each kept their freed TLS
    // and HTTP memory apart from the main heap's, adding to the peak with many requests held
    // (docs/benchmarks/footprint.md); small blocks still come from each thread's cache without a lock.
    mallopt(M_ARENA_MAX, 1);
    auto cfg = to_proxy_config(f);
    auto sopts = to_server_options(f);
    auto [listen, opts, ms, log] = prepare_listener_service(f.listen, f.rt, f.pg, g.level());
    effective_config settings("proxy");
    settings.add("listen", f.listen)
        .add("tls", !f.listener.tls_cert.empty())
        .add_address("upstream", cfg.upstream)
        .add("stripe_key_from", cg::app::stripe_key_source(f.stripe_key_file, std::getenv("STRIPE_API_KEY")))
        .add("max_body_bytes", cfg.max_body_bytes)
        .add("same_key_window_s", static_cast<std::int64_t>(cfg.same_key_window.count()))
        .add("replay_window_s", static_cast<std::int64_t>(cfg.replay_window.count()))
        .add("resolve_interval_ms", static_cast<std::int64_t>(cfg.resolve_interval.count()))
        .add_address("pg", to_pg_config(f.pg).describe());
    add_runtime_settings(settings, f.rt, opts);
    settings.log(log, "proxy starting");

    runtime rt(opts, log);
    rt.set_effective_config(settings);
    auto pool = start_pool(rt, f.pg, false);
    auto p = vault::proxy::create(rt.io().get_executor(), rt.offload().get_executor(), std::move(cfg), pool,
                                  log, rt.metrics());
    if (!p) {
        log.error("cannot create the proxy", {{"error", p.err().describe()}});
        return 1;
    }
    (*p)->add_readiness(rt.health());
    // /startupz: PostgreSQL answered once, the schema gate passed, and the upstream was reachable once.
    rt.startup().require("postgres", "PostgreSQL (first connection)");
    schema_gate gate(rt, pool, ms);
    rt.startup().require("upstream", "the upstream (first successful probe)",
                         [px = p->get()] { return px->upstream_reached_once(); });
    sopts.metrics = &rt.metrics();
    sopts.listener = "proxy";
    http::server server(rt.io().get_executor(), (*p)->routes(), std::move(sopts), log);
    auto ep = server.listen(listen);
    if (!ep) {
        log.error("cannot listen", {{"error", ep.err().describe()}});
        return 1;
    }
    rt.on_shutdown([&server, px = p->get(), pool]() { return drain(&server, px, pool); });
    // PostgreSQL (and --migrate) as consume waits for it, then the schema gate; only then does the listener
    // accept (a client connecting earlier waits in the backlog) and the background tasks start.
    return rt.start_and_run(start_when_ready(
        &rt, pool.get(), &f.pg, std::move(ms), &gate, [&rt, px = p->get(), &server, ep = *ep] {
            px->start();
            server.start();
            rt.log().info("vault proxy listening",
                          {{"address", ep.address().to_string()}, {"port", ep.port()}});
        }));
}

}  // namespace

void register_proxy(CLI::App& app, command_main& selected) {
    auto* cmd = add_service_command(
        app, "proxy", "the spend-cap vault proxy: Stripe's API for vault keys, capped per period",
        "  chargeguard proxy --listen 0.0.0.0:8420 --stripe-key-file /run/secrets/stripe_api_key --migrate\n"
        "  chargeguard proxy --tls-cert vault.pem --tls-key vault.key --upstream-timeout 45s\n");
    auto f = std::make_shared<proxy_flags>();
    cmd->add_option("--listen", f->listen, "address for the Stripe-compatible API")->capture_default_str();
    cmd->add_option("--upstream", f->upstream, "Stripe API origin the proxy forwards to")
        ->capture_default_str();
    cmd->add_option("--stripe-key-file", f->stripe_key_file,
                    "file holding the real Stripe key (else STRIPE_API_KEY)");
    cmd->add_option("--stripe-ca-file", f->stripe_ca_file,
                    "PEM CA bundle to verify the upstream (default: system store)");
    add_duration_option(*cmd, "--upstream-connect-timeout", f->upstream_connect_timeout_s,
                        "time for DNS + TCP + TLS to Stripe", 0.001, 600.0);
    add_duration_option(*cmd, "--upstream-timeout", f->upstream_timeout_s,
                        "time for one forwarded request; past it the reservation is uncertain", 0.001, 600.0);
    cmd->add_option("--upstream-max-connections", f->upstream_max_connections, "pooled connections to Stripe")
        ->check(CLI::Range(1u, 4096u))
        ->capture_default_str();
    cmd->add_option("--max-forwarding", f->max_forwarding,
                    "requests reserved and forwarded at once; past it a checked request waits, unreserved, "
                    "within --upstream-timeout (0: twice --upstream-max-connections)")
        ->check(CLI::Range(0u, 65536u))
        ->capture_default_str();
    cmd->add_option("--max-body-bytes", f->max_body_bytes, "largest create body accepted (larger: 413)")
        ->check(CLI::Range(std::size_t{256}, std::size_t{16 * 1024 * 1024}))
        ->capture_default_str();
    add_listener_flags(*cmd, f->listener);
    cmd->add_option(
           "--same-key-window", f->same_key_window,
           "refuse a retry whose Idempotency-Key was first used longer ago; 1m to 23h (Stripe may forget "
           "a key once it is 24 h old)")
        ->capture_default_str();
    cmd->add_option("--replay-window", f->replay_window,
                    "the resolver re-sends an uncertain request under its key only while it is younger than "
                    "this, then searches Stripe; keep it well under consume's --new-key-quiet")
        ->capture_default_str();
    cmd->add_option("--resolve-interval", f->resolve_interval,
                    "how often uncertain reservations are looked at")
        ->capture_default_str();
    cmd->add_option("--stale-reserved", f->stale_reserved,
                    "a reservation still `reserved` this long after its last change is treated as abandoned")
        ->capture_default_str();
    cmd->add_option(
           "--key-cache-ttl", f->key_cache_ttl,
           "reuse a key's row this long (creates re-check revocation under the key's lock; reads may pass "
           "this long after a revoke); 0 reads it on every request")
        ->capture_default_str();
    cmd->add_option("--cap-lease", f->cap_lease,
                    "once a key has a steady stream of creates, lease this long of its pace from the cap and "
                    "spend it without a PostgreSQL round trip per create (at most 1/8 of the free room; none "
                    "near the cap); 0: every create reserves in PostgreSQL before it is forwarded")
        ->capture_default_str();
    cmd->add_flag(
        "--upstream-on-main", f->upstream_on_main,
        "forward on the main loop instead of the offload threads (saves two thread hops per request; "
        "the TLS records are encrypted on the main loop)");
    add_allow_insecure_http_flag(*cmd, f->allow_insecure_http);
    add_pg_flags(*cmd, f->pg, true);
    add_runtime_flags(*cmd, f->rt);
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return run_proxy(*f, g); }; });
}

}  // namespace cg::app
