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
    app.add_option("--max-concurrent", limits.max_concurrent, "requests in flight before 429 (0: off)")
        ->capture_default_str();
    app.add_option("--latency-ms", latency_ms, "added to every /v1 request")->capture_default_str();
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
