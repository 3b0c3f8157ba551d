// fake-stripe executable: serves the double over HTTPS until SIGINT/SIGTERM. Prints one line
// "fake-stripe listening on HOST:PORT" on stdout once it accepts connections (port 0 → ephemeral).
#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>

#include "net/tls.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

int main(int argc, char** argv) {
    CLI::App app{"fake-stripe: a stateful Stripe API double for tests"};
    std::string listen = "127.0.0.1:0", cert, key;
    std::vector<std::string> declines;
    std::string decline_code = "card_declined";
    app.add_option("--listen", listen, "host:port")->capture_default_str();
    app.add_option("--cert", cert, "PEM certificate chain")->required();
    app.add_option("--key", key, "PEM private key")->required();
    app.add_option("--decline", declines, "customer id whose charges are declined (repeatable)");
    app.add_option("--decline-code", decline_code, "error code for those declines")->capture_default_str();
    cg::fake::limits limits;
    int latency_ms = 0;
    app.add_option("--global-rps", limits.global_rps, "account-wide requests/s before 429 (0: off)")
        ->capture_default_str();
    app.add_option("--endpoint-rps", limits.endpoint_rps, "requests/s per endpoint before 429 (0: off)")
        ->capture_default_str();
    app.add_option("--rate-burst", limits.burst_s, "token bucket depth in seconds of its rate")
        ->capture_default_str();
    app.add_option("--rate-refill", limits.refill_s,
                   "token bucket refill: 0 continuous, else whole tokens every this many seconds")
        ->capture_default_str();
    app.add_option("--max-concurrent", limits.max_concurrent, "requests in flight before 429 (0: off)")
        ->capture_default_str();
    app.add_option("--latency-ms", latency_ms, "added to every /v1 request")->capture_default_str();
    int settle_after_ms = 2000;
    app.add_option("--settle-after-ms", settle_after_ms,
                   "how long a bank-debit PaymentIntent (pm_usBankAccount_*) stays processing")
        ->capture_default_str();
    cg::fake::webhook_endpoint hook;
    cg::fake::webhook_faults hook_faults;
    app.add_option("--webhook-url", hook.url, "deliver events here (http(s)://host:port/path)");
    app.add_option("--webhook-secret", hook.secrets,
                   "endpoint signing secret whsec_… (repeatable: one v1 each, as during a rotation)");
    app.add_option("--webhook-events", hook.enabled_events,
                   "event types delivered (repeatable; default all)");
    app.add_option("--webhook-ca", hook.ca_file, "CA bundle for an https webhook url");
    app.add_option("--webhook-retry-base-ms", hook.retry_base_ms, "first retry delay, doubling")
        ->capture_default_str();
    app.add_option("--webhook-retry-max-ms", hook.retry_max_ms, "retry delay cap")->capture_default_str();
    app.add_option("--webhook-max-attempts", hook.max_attempts, "attempts before an event is given up")
        ->capture_default_str();
    app.add_option("--webhook-delay-ms", hook_faults.delay_ms, "each event goes out no earlier than this")
        ->capture_default_str();
    app.add_option("--webhook-duplicate-pct", hook_faults.duplicate_pct, "percent of events delivered twice")
        ->capture_default_str();
    app.add_option("--webhook-reorder-pct", hook_faults.reorder_pct,
                   "percent of events held back behind a later event about the same object")
        ->capture_default_str();
    app.add_option("--webhook-reorder-hold-ms", hook_faults.reorder_hold_ms,
                   "longest a reordered event is held back")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    auto where = cg::net::parse_host_port(listen);
    if (!where) {
        std::fprintf(stderr, "fake-stripe: %s\n", where.err().describe().c_str());
        return 2;
    }
    auto tls = cg::net::make_tls_server_context({cert, key});
    if (!tls) {
        std::fprintf(stderr, "fake-stripe: %s\n", tls.err().describe().c_str());
        return 2;
    }
    asio::io_context io{1};
    cg::logger log(std::make_shared<cg::fd_sink>(2), cg::log_level::warn);
    cg::fake::fake_stripe fake(io.get_executor(), *tls, log);
    for (const auto& c : declines) fake.decline(c, {decline_code, "generic_decline"});
    fake.set_limits(limits);
    fake.faults().latency_ms = latency_ms;
    fake.settle_after(std::chrono::milliseconds(settle_after_ms));
    fake.webhooks().configure(hook);
    fake.webhooks().faults() = hook_faults;
    auto ep = fake.listen(*where);
    if (!ep) {
        std::fprintf(stderr, "fake-stripe: %s\n", ep.err().describe().c_str());
        return 1;
    }
    fake.start();
    std::printf("fake-stripe listening on %s:%u\n", ep->address().to_string().c_str(), ep->port());
    std::fflush(stdout);
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code, int) {
        fake.stop();
        io.stop();
    });
    io.run();
    return 0;
}
