// Benchmark: stripe::client → fake-stripe over TLS.
//   1. charges/s at 0 ms latency over 1, 8 and 32 pooled TLS connections (2 callers per connection);
//   2. concurrency reached at 200 ms latency with 1 000 requests outstanding (pool of 32 and of 1 000).
// Prints throughput, TLS handshakes, CPU seconds (whole process: client + fake) and max RSS.
// Usage: stripe_client [CERT_DIR] [SECONDS]   (CERT_DIR defaults to $CG_TEST_CERTS)
#include <sys/resource.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "support/fake_stripe_thread.hpp"
#include "support/process_usage.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

using namespace cg;
using clock_type = std::chrono::steady_clock;

namespace {

using fake_thread = test::fake_stripe_thread;

struct run_stats {
    int ok = 0, failed = 0;
    int outstanding = 0, max_outstanding = 0;
};

stripe::charge_request req(const std::string& key) {
    stripe::charge_request r;
    r.amount = 1999;
    r.currency = "usd";
    r.customer = "cus_bench";
    r.metadata = {{"billing_key", key}};
    r.idempotency_key = key;
    return r;
}

// A caller on the main loop: charges until the deadline.
asio::awaitable<void> caller(stripe::client* c, std::string prefix, clock_type::time_point until,
                             run_stats* s) {
    for (int i = 0; clock_type::now() < until; ++i) {
        auto o = co_await c->create_charge(req(prefix + "-" + std::to_string(i)));
        (o.cls == stripe::outcome_class::succeeded ? s->ok : s->failed)++;
    }
}

// One request; counts how many are outstanding at once.
asio::awaitable<void> one(stripe::client* c, std::string key, run_stats* s) {
    s->max_outstanding = std::max(s->max_outstanding, ++s->outstanding);
    auto o = co_await c->create_charge(req(key));
    --s->outstanding;
    (o.cls == stripe::outcome_class::succeeded ? s->ok : s->failed)++;
}

std::unique_ptr<stripe::client> make_client(net::offload_pool& pool, const std::string& certs,
                                            std::uint16_t port, std::size_t conns) {
    stripe::client_config cfg;
    cfg.api_base = "https://127.0.0.1:" + std::to_string(port);
    cfg.api_key = "sk_test_bench";
    cfg.ca_file = certs + "/ca.pem";
    cfg.max_connections = conns;
    cfg.request_timeout = std::chrono::seconds(30);
    auto c = stripe::client::create(pool.get_executor(), cfg, logger());
    if (!c) throw std::runtime_error(c.err().describe());
    return std::move(*c);
}

void throughput(fake_thread& f, net::offload_pool& pool, const std::string& certs, std::size_t conns,
                double secs) {
    auto c = make_client(pool, certs, f.port, conns);
    asio::io_context main_loop{1};
    run_stats s;
    double cpu0 = cg::test::cpu_seconds();
    auto t0 = clock_type::now();
    auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(secs));
    for (std::size_t i = 0; i < conns * 2; ++i)
        asio::co_spawn(main_loop,
                       caller(c.get(), "tp" + std::to_string(conns) + "-" + std::to_string(i), until, &s),
                       asio::detached);
    main_loop.run();
    double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    auto st = c->http_stats();
    std::printf(
        "0 ms latency, %3zu connections, %3zu callers: %8.0f charges/s  (%d ok, %d failed, %.1f s)  "
        "TLS handshakes %llu  CPU %.2f s  maxRSS %ld MiB\n",
        conns, conns * 2, s.ok / wall, s.ok, s.failed, wall, static_cast<unsigned long long>(st.handshakes),
        cg::test::cpu_seconds() - cpu0, (cg::test::peak_rss_kib() / 1024));
}

void outstanding(fake_thread& f, net::offload_pool& pool, const std::string& certs, std::size_t conns,
                 int n) {
    f.on_fake([&] {
        f.fake->reset();  // clears max_concurrent (and state) but keeps nothing in flight
        f.fake->faults().latency_ms = 200;
        return 0;
    });
    auto c = make_client(pool, certs, f.port, conns);
    asio::io_context main_loop{1};
    run_stats s;
    double cpu0 = cg::test::cpu_seconds();
    auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i)
        asio::co_spawn(main_loop, one(c.get(), "out" + std::to_string(conns) + "-" + std::to_string(i), &s),
                       asio::detached);
    main_loop.run();
    double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    int server_conc = f.on_fake([&] { return f.fake->max_concurrent(); });
    auto st = c->http_stats();
    std::printf(
        "200 ms latency, %4d outstanding, pool %4zu: concurrency reached at fake-stripe %4d  "
        "%7.0f charges/s  (%d ok, %d failed, %.2f s)  TLS handshakes %llu  CPU %.2f s  maxRSS %ld MiB\n",
        n, conns, server_conc, s.ok / wall, s.ok, s.failed, wall,
        static_cast<unsigned long long>(st.handshakes), cg::test::cpu_seconds() - cpu0,
        (cg::test::peak_rss_kib() / 1024));
}

}  // namespace

int main(int argc, char** argv) {
    std::string certs =
        argc > 1 ? argv[1] : (std::getenv("CG_TEST_CERTS") ? std::getenv("CG_TEST_CERTS") : "");
    double secs = argc > 2 ? std::atof(argv[2]) : 3.0;
    if (certs.empty()) {
        std::fprintf(stderr,
                     "usage: stripe_client CERT_DIR [SECONDS]  (CERT_DIR: build/tests/unit/http/client)\n");
        return 2;
    }
    try {
        fake_thread f(certs);
        net::offload_pool pool(2);
        std::printf(
            "stripe_client bench: client on a 2-thread offload pool (one strand), fake-stripe on its own "
            "thread\n");
        for (std::size_t conns : {1, 8, 32}) throughput(f, pool, certs, conns, secs);
        outstanding(f, pool, certs, 32, 1000);
        outstanding(f, pool, certs, 1000, 1000);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "stripe_client: %s\n", e.what());
        return 1;
    }
    return 0;
}
