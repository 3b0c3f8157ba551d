#include "app/runtime.hpp"

#include <sys/resource.h>

#include <asio/co_spawn.hpp>
#include <csignal>

#include "app/build_info.hpp"
#include "http/health_routes.hpp"
#include "metrics/process.hpp"
#include "net/timeout.hpp"
#include "net/turn_budget.hpp"

namespace cg::app {

namespace {
double as_seconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

// Runs every drain as its own coroutine and completes when all have. The shared state outlives this
// coroutine when it is cancelled by the shutdown timeout while drains are still running.
struct join_state {
    std::size_t left;
    net::steady_timer done;
    std::size_t failed = 0;
};

// A drain that throws did not drain: it is logged with its reason and counted (the exit code says so),
// never dropped silently. Returns how many failed.
asio::awaitable<std::size_t> run_all(std::vector<runtime::drain_fn> fns, logger log) {
    auto ex = co_await asio::this_coro::executor;
    auto st = std::make_shared<join_state>(
        join_state{fns.size(), net::steady_timer(ex, std::chrono::steady_clock::time_point::max())});
    for (auto& fn : fns) {
        asio::co_spawn(ex, fn(), [st, log](std::exception_ptr e) {
            if (e) {
                ++st->failed;
                log.error("shutdown step failed", {{"error", describe_exception(e)}});
            }
            if (--st->left == 0) st->done.cancel();
        });
    }
    if (st->left > 0) co_await st->done.async_wait();
    co_return st->failed;
}
// Go's runtime does the same since 1.19: the soft limit (often 1024) is a leftover of select(2); every
// socket here is driven by epoll. Returns the limit now in force.
rlim_t raise_fd_limit() {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rlimit want = rl;
        want.rlim_cur = rl.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    }
    return rl.rlim_cur;
}

bool is_loopback(const std::string& host) {
    std::error_code ec;
    auto a = asio::ip::make_address(host, ec);
    return !ec && a.is_loopback();
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGINT:
            return "SIGINT";
        case SIGHUP:
            return "SIGHUP";
        default:
            return "SIGTERM";
    }
}
}  // namespace

runtime::runtime(runtime_options opts, logger log)
    : opts_(std::move(opts)), log_(std::move(log)), loops_(opts_.offload_threads), signals_(io_) {}

runtime::~runtime() {
    if (probe_) probe_->stop();
    // Both contexts' queued handlers are destroyed here, while every member they may refer to exists.
    loops_.shut_down();
}

result<net::tcp::endpoint> runtime::start() {
    auto& lag_hist = metrics_
                         .histogram("chargeguard_event_loop_lag_seconds",
                                    "Lateness of a periodic timer on the main event loop")
                         .Add({}, metrics::latency_buckets());
    probe_ = std::make_shared<net::lag_probe>(io_.get_executor(), opts_.lag_interval,
                                              [&lag_hist](double s) { lag_hist.Observe(s); });
    probe_->start();
    auto& deferred = metrics_
                         .counter("chargeguard_event_loop_steps_deferred_total",
                                  "deliveries' steps that waited for a later turn of the main event loop "
                                  "(--loop-turn-budget)")
                         .Add({});
    auto& budget = net::turn_budget::of(io_.get_executor());
    budget.set(opts_.turn_budget);
    budget.on_defer([&deferred] { deferred.Increment(); });
    health_.add_liveness("event_loop", [this]() {
        double lag = probe_->recent_max_lag(opts_.lag_window);
        char buf[96];
        std::snprintf(buf, sizeof buf, "max lag %.4fs in the last %.0fs (limit %.3fs)", lag,
                      as_seconds(opts_.lag_window), as_seconds(opts_.max_loop_lag));
        return metrics::check_status{lag <= as_seconds(opts_.max_loop_lag), buf};
    });
    add_build_info_metric(metrics_);
    metrics_.add_collectable(std::make_shared<metrics::process_collector>());
    auto fd_limit = raise_fd_limit();
    // Off loopback, /readyz must not hand out the database's host, port or user.
    http::health_route_options hopts;
    hopts.redact_details = !is_loopback(opts_.health_listen.host);
    http::add_health_routes(routes_, metrics_, health_, startup_, hopts);
    // /config off loopback without basic auth: the addresses left out, as /readyz leaves them out there.
    const std::string* config_json =
        hopts.redact_details && !opts_.health_basic_auth ? &config_json_redacted_ : &config_json_;
    if (!config_json_.empty())
        routes_.add("GET", "/config", [config_json](http::request&) { return config(config_json); });
    http::server_options sopts;
    sopts.tls = opts_.health_tls;
    // With basic auth, the probes' routes stay open (a kubelet's httpGet probe cannot read a secret file,
    // and they say only ok or why not: redacted off loopback); every other route, present or added later,
    // asks for credentials.
    http::router served = routes_;
    if (opts_.health_basic_auth) {
        served = http::router();
        for (const char* open : {"/healthz", "/readyz", "/startupz"})
            served.add("GET", open, [this](http::request& r) { return routes_.dispatch(r); });
        served.add_prefix("", "/", [this](http::request& r) { return guarded(this, r); });
    }
    server_ = std::make_unique<http::server>(io_.get_executor(), std::move(served), std::move(sopts), log_);
    auto ep = server_->listen(opts_.health_listen);
    if (!ep) return ep.err();
    server_->start();
    if (opts_.handle_signals) {
        signals_.add(SIGINT);
        signals_.add(SIGTERM);
        signals_.add(SIGHUP);
        wait_signal();
    }
    log_.info("health server listening", {{"address", ep->address().to_string()},
                                          {"port", ep->port()},
                                          {"redacted", hopts.redact_details},
                                          {"tls", opts_.health_tls != nullptr},
                                          {"basic_auth", opts_.health_basic_auth != nullptr},
                                          {"fd_limit", static_cast<std::int64_t>(fd_limit)}});
    return ep;
}

asio::awaitable<http::response> runtime::config(const std::string* json) {
    co_return http::make_response(200, *json, "application/json");
}

asio::awaitable<http::response> runtime::guarded(runtime* self, http::request& req) {
    // Named, not a temporary of the co_await expression: GCC 12 destroys a conditional's temporary in a
    // co_await twice.
    std::string authorization;
    if (auto header = req.headers.get("Authorization")) authorization = *header;
    auto check =
        self->opts_.health_basic_auth->check(std::move(authorization), self->offload_.get_executor());
    auto v = co_await std::move(check);
    if (v == health_auth::verdict::allowed) co_return co_await self->routes_.dispatch(req);
    if (v == health_auth::verdict::busy) {
        auto r = http::make_response(429, "too many credentials being checked; retry\n");
        r.headers.add("Retry-After", "1");
        co_return r;
    }
    auto r = http::make_response(401, "unauthorized\n");
    r.headers.add("WWW-Authenticate",
                  std::string("Basic realm=\"") + health_auth::realm + "\", charset=\"UTF-8\"");
    co_return r;
}

void runtime::wait_signal() {
    signals_.async_wait([this](std::error_code ec, int sig) {
        if (ec) return;
        if (!stopping_) {
            // SIGHUP drains like SIGTERM but ends non-zero (129, 128 + SIGHUP): nothing is reloaded in place
            // (docs/operating/process.md "Signals"), so a supervisor that restarts only on failure
            // (systemd Restart=on-failure, docker --restart on-failure) must start it again to pick up the
            // new configuration, where exit 0 would leave the sidecar down.
            request_stop(signal_name(sig), sig == SIGHUP ? exit_hangup : 0);
            wait_signal();
        } else {
            log_.warn("second signal: stopping at once", {{"signal", sig}});
            exit_code_ = 130;
            io_.stop();
        }
    });
}

void runtime::spawn_startup(asio::awaitable<void> step) {
    asio::co_spawn(io_, std::move(step), [this](std::exception_ptr e) {
        if (!e) return;
        log_.error("startup failed", {{"error", describe_exception(e)}});
        request_stop("startup failed", 1);
    });
}

int runtime::start_and_run(asio::awaitable<void> startup) {
    if (auto ep = start(); !ep) {
        log_.error("cannot start", {{"error", ep.err().describe()}});
        return 1;
    }
    spawn_startup(std::move(startup));
    return run();
}

void runtime::request_stop(std::string_view reason, int exit_code) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = exit_code;
    log_.info("shutdown requested", {{"reason", reason}, {"timeout_s", as_seconds(opts_.shutdown_timeout)}});
    asio::co_spawn(io_, shutdown(this), [this](std::exception_ptr e) {
        if (e) {
            exit_code_ = 1;
            log_.error("shutdown failed", {{"error", describe_exception(e)}});
        }
        io_.stop();
    });
}

asio::awaitable<void> runtime::shutdown(runtime* self) {
    auto started = std::chrono::steady_clock::now();
    auto failed =
        co_await net::with_timeout(run_all(self->drains_, self->log_), self->opts_.shutdown_timeout);
    bool in_time = failed.has_value();
    if (failed && *failed > 0) self->exit_code_ = 1;
    if (!in_time) {
        self->exit_code_ = 1;
        self->log_.warn("shutdown timed out; abandoning remaining work");
    }
    if (self->server_) self->server_->stop();
    if (self->probe_) self->probe_->stop();
    std::error_code ignored;
    self->signals_.cancel(ignored);
    self->log_.info("shutdown complete", {{"seconds", as_seconds(std::chrono::steady_clock::now() - started)},
                                          {"clean", in_time && *failed == 0}});
}

int runtime::run() {
    io_.run();
    return exit_code_;
}

}  // namespace cg::app
