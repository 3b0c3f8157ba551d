// nsq_consume: consume N 200-byte messages with a no-op handler, max_in_flight 2500, and print msgs/s,
// consumer CPU-seconds per 10^6 messages and peak RSS.
//   nsq_consume [N]                        → against fake-nsqd, forked into its own process first
//   NSQD_TCP_ADDRESS=host:4150 nsq_consume → against a real nsqd (N messages are MPUBed first)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_nsqd.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "nsq/consumer.hpp"
#include "nsq/producer.hpp"
#include "support/process_usage.hpp"

using namespace std::chrono;

namespace {

// The child: a fake nsqd preloaded with n messages; writes its port to `fd`, runs until SIGTERM.
[[noreturn]] void run_fake(int fd, long n) {
    asio::io_context io(1);
    cg::test::nsq::fake_nsqd nsqd(io.get_executor());
    if (!nsqd.start()) std::_Exit(1);
    nsqd.create_channel("bench", "bench");
    std::string body(200, 'x');
    for (long i = 0; i < n; ++i) nsqd.publish("bench", body);
    auto port = nsqd.tcp_port();
    if (::write(fd, &port, sizeof port) != sizeof port) std::_Exit(1);
    ::close(fd);
    asio::signal_set sigs(io, SIGTERM);
    sigs.async_wait([&](std::error_code, int) { io.stop(); });
    io.run();
    std::_Exit(0);
}

asio::awaitable<bool> preload_real(std::string addr, long n) {
    auto ex = co_await asio::this_coro::executor;
    cg::nsq::producer prod(ex, addr, {}, {});
    std::vector<std::string> batch(500, std::string(200, 'x'));
    for (long sent = 0; sent < n; sent += 500) {
        batch.resize(static_cast<std::size_t>(std::min<long>(500, n - sent)), std::string(200, 'x'));
        if (!co_await prod.multi_publish("bench", batch)) co_return false;
    }
    co_await prod.close();
    co_return true;
}

}  // namespace

int main(int argc, char** argv) {
    long n = argc > 1 ? std::atol(argv[1]) : 1000000;
    const char* real = std::getenv("NSQD_TCP_ADDRESS");
    std::string address;
    pid_t child = -1;
    if (real) {
        address = real;
        asio::io_context io(1);
        bool ok = false;
        asio::co_spawn(io, preload_real(address, n), [&](std::exception_ptr e, bool r) { ok = !e && r; });
        io.run();
        if (!ok) {
            std::fprintf(stderr, "cannot publish to %s\n", real);
            return 1;
        }
    } else {
        int fds[2];
        if (::pipe(fds) != 0) return 1;
        child = ::fork();
        if (child == 0) {
            ::close(fds[0]);
            run_fake(fds[1], n);
        }
        ::close(fds[1]);
        std::uint16_t port = 0;
        if (::read(fds[0], &port, sizeof port) != sizeof port) return 1;
        address = "127.0.0.1:" + std::to_string(port);
    }

    asio::io_context io(1);
    cg::metrics::registry reg;
    cg::nsq::consumer_config cfg;
    cfg.topic = "bench";
    cfg.channel = "bench";
    cfg.nsqd_tcp_addresses = {address};
    cfg.max_in_flight = 2500;
    long handled = 0;
    auto t0 = steady_clock::now();
    double cpu0 = cg::test::cpu_seconds();
    std::unique_ptr<cg::nsq::consumer> c;
    c = std::make_unique<cg::nsq::consumer>(io.get_executor(), cfg,
        [&](cg::nsq::message&) -> asio::awaitable<cg::nsq::disposition> {
            if (++handled == n) {
                asio::co_spawn(io, [&]() -> asio::awaitable<void> { co_await c->stop(); }, asio::detached);
            }
            co_return cg::nsq::disposition::finish();
        },
        cg::logger{}, reg);
    if (!c->start()) return 1;
    io.run();
    auto secs = duration<double>(steady_clock::now() - t0).count();
    double cpu = cg::test::cpu_seconds() - cpu0;
    if (child > 0) {
        ::kill(child, SIGTERM);
        ::waitpid(child, nullptr, 0);
    }
    std::printf("nsq_consume: %ld messages of 200 bytes from %s (%s), max_in_flight 2500\n", n, address.c_str(),
                real ? "real nsqd" : "fake-nsqd");
    std::printf("  throughput   %.0f msgs/s (%.2f s)\n", static_cast<double>(n) / secs, secs);
    std::printf("  consumer CPU %.2f CPU-s per 10^6 messages\n", cpu / (static_cast<double>(n) / 1e6));
    std::printf("  peak RSS     %.1f MB\n", static_cast<double>(cg::test::peak_rss_kib()) / 1024.0);
    std::printf("  finished     %llu, fin_failed %llu\n", static_cast<unsigned long long>(c->stats().finished),
                static_cast<unsigned long long>(c->stats().fin_failed));
    return c->stats().finished == static_cast<std::uint64_t>(n) ? 0 : 1;
}
