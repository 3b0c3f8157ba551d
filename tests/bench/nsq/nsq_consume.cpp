// nsq_consume: consume N 200-byte messages with a no-op handler (max_in_flight 2500) and print msgs/s,
// consumer CPU-seconds per 10^6 messages and peak RSS, for every target in one run:
//   - fake-nsqd (forked into its own process), always;
//   - with NSQD_BIN set: real nsqd 1.3.0 plain, snappy, deflate, and TLS (TLS needs CG_NSQ_TEST_CERTS, the
//     PKI the nsq_real tests generate: build/tests/integration/nsq_real);
//   - nsqd's deliverable ceiling (plain): the same N messages read by a raw reader — one blocking socket
//     in its own process that parses frames in place and FINs each message, no consumer machinery. It is
//     held to the consumer's protocol: the same IDENTIFY defaults (heartbeat 30 s, nsqd's output buffer
//     16 KiB / 250 ms), the same RDY 2500 (= max_in_flight, nsqd's max_rdy_count), one FIN per message,
//     FINs written once per read (the consumer coalesces its FINs per write the same way). So "% of
//     ceiling" is chargeguard's consumer against the fastest a client can be fed by this nsqd.
// Ceiling and plain run as paired rounds in alternating order (CG_NSQ_BENCH_ROUNDS, default 3) so load
// from elsewhere on the machine hits both alike; per-round lines, then the medians and the median of the
// paired ratios. Rates run from the first message to the 99 % mark (nsqd's 250 ms flush tick quantises
// the time to the last one; "total" shows it). Each measurement runs in a fresh child process (peak RSS is
// per process) against a fresh nsqd preloaded before the clock starts, with a memory queue large enough
// to keep every message in memory.
// Where the two differ, it is not in the consumer's favour: the consumer's CPU window opens before it
// connects (IDENTIFY, SUB) and closes after its drain, the raw reader's opens after SUB and closes at its
// last message; the raw reader reads into a 1 MiB buffer, the consumer 64 KiB at a time (both read far
// less per call on average: "waits" bounds the number of reads from below). Each line also shows the
// kernel's share of the CPU ("sys") and the voluntary context switches ("waits": blocks for data).
// Instructions per message (repeatable where CPU times are not, on a shared machine): run one mode under
// callgrind and divide the inclusive Ir of consume() or raw_reader() (kept out of line for this) by N:
//   valgrind --tool=callgrind nsq_consume 200000 plain
//   callgrind_annotate --inclusive=yes callgrind.out.<the child's pid> | grep consume
//
// Usage: nsq_consume [N [ONLY]]   (N default 200000; ONLY: one of fake, ceiling, plain, snappy, deflate,
//   tls — for profiling one mode — or pair: the ceiling/plain rounds alone)
#include "nsq_consume.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "support/process_usage.hpp"

using namespace std::chrono;
using namespace nsq_bench;

namespace {

asio::awaitable<void> stop_consumer(cg::nsq::consumer* c) {
    co_await c->stop();
}

asio::awaitable<cg::nsq::disposition> count_and_finish(long* handled, long n, asio::io_context* io,
                                                       cg::nsq::consumer** c, steady_clock::time_point* last,
                                                       steady_clock_marks* marks) {
    marks->on_message(++*handled);
    if (*handled == n) {
        *last = steady_clock::now();
        asio::co_spawn(*io, stop_consumer(*c), [](std::exception_ptr) {});
    }
    co_return cg::nsq::disposition::finish();
}

[[gnu::noinline]] figures consume(std::uint16_t port, long n, cg::nsq::nsq_security sec) {
    figures f;
    asio::io_context io(1);
    cg::metrics::registry reg;
    cg::nsq::consumer_config cfg;
    cfg.topic = "bench";
    cfg.channel = "bench";
    cfg.nsqd_tcp_addresses = {"127.0.0.1:" + std::to_string(port)};
    cfg.max_in_flight = 2500;
    cfg.security = std::move(sec);
    long handled = 0;
    cg::nsq::consumer* cp = nullptr;
    steady_clock::time_point last{};
    steady_clock_marks marks{n};
    auto t0 = steady_clock::now();
    double cpu0 = cg::test::cpu_seconds(), sys0 = nsq_bench::sys_seconds(), waits0 = waits();
    cg::nsq::consumer c(
        io.get_executor(), cfg,
        [&handled, n, &io, &cp, &last, &marks](cg::nsq::message&) {
            return count_and_finish(&handled, n, &io, &cp, &last, &marks);
        },
        cg::logger{}, reg);
    cp = &c;
    if (!c.start()) return f;
    io.run();
    // Throughput up to the last message handled (the drain after it is not delivery); CPU includes it.
    f.total_s = duration<double>(last - t0).count();
    f.msgs_per_s = marks.rate();
    f.cpu_per_million = (cg::test::cpu_seconds() - cpu0) / (static_cast<double>(handled) / 1e6);
    f.sys_per_million = (nsq_bench::sys_seconds() - sys0) / (static_cast<double>(handled) / 1e6);
    f.waits_per_million = (waits() - waits0) / (static_cast<double>(handled) / 1e6);
    f.drain_s = duration<double>(steady_clock::now() - last).count();
    f.rss_mb = static_cast<double>(cg::test::peak_rss_kib()) / 1024.0;
    f.finished = static_cast<long>(c.stats().finished);
    return f;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Each figure's median over the rounds (peak RSS: the largest; finished: the fewest).
figures median_of(const std::vector<figures>& fs) {
    auto field = [&fs](double figures::*m) {
        std::vector<double> v;
        for (const auto& f : fs) v.push_back(f.*m);
        return median(v);
    };
    figures out;
    out.msgs_per_s = field(&figures::msgs_per_s);
    out.total_s = field(&figures::total_s);
    out.cpu_per_million = field(&figures::cpu_per_million);
    out.sys_per_million = field(&figures::sys_per_million);
    out.waits_per_million = field(&figures::waits_per_million);
    out.drain_s = field(&figures::drain_s);
    out.nsqd_cpu_per_million = field(&figures::nsqd_cpu_per_million);
    out.finished = fs.front().finished;
    for (const auto& f : fs) {
        out.rss_mb = std::max(out.rss_mb, f.rss_mb);
        out.finished = std::min(out.finished, f.finished);
    }
    return out;
}

void print(const char* name, const figures& f, long n, double ceiling) {
    std::printf(
        "  %-24s %9.0f msgs/s  %5.2f CPU-s/10^6 (sys %4.2f)  peak RSS %5.1f MB  finished %ld/%ld  total %.2f "
        "s",
        name, f.msgs_per_s, f.cpu_per_million, f.sys_per_million, f.rss_mb, f.finished, n, f.total_s);
    if (f.nsqd_cpu_per_million > 0) std::printf("  nsqd %.2f CPU-s/10^6", f.nsqd_cpu_per_million);
    if (f.waits_per_million > 0) std::printf("  waits %.0f/10^6", f.waits_per_million);
    if (f.drain_s > 0) std::printf("  drain %.2f s", f.drain_s);
    if (ceiling > 0) std::printf("  (%.0f %% of ceiling)", 100.0 * f.msgs_per_s / ceiling);
    std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
    long n = argc > 1 ? std::atol(argv[1]) : 200000;
    std::string only = argc > 2 ? argv[2] : "";
    auto want = [&only](const char* m) {
        return only.empty() || only == m ||
               (only == "pair" && (!std::strcmp(m, "ceiling") || !std::strcmp(m, "plain")));
    };
    std::printf("nsq_consume: %ld messages of 200 bytes, no-op handler, max_in_flight 2500\n", n);
    bool ok = true;

    // fake-nsqd
    if (want("fake")) {
        int fds[2];
        if (::pipe(fds) != 0) return 1;
        pid_t child = ::fork();
        if (child == 0) {
            ::close(fds[0]);
            run_fake(fds[1], n);
        }
        ::close(fds[1]);
        std::uint16_t port = 0;
        if (::read(fds[0], &port, sizeof port) != sizeof port) return 1;
        auto f = in_child([&] { return consume(port, n, {}); });
        ::kill(child, SIGTERM);
        ::waitpid(child, nullptr, 0);
        print("fake-nsqd", f, n, 0);
        ok = ok && f.finished == n;
    }

    const char* bin = std::getenv("NSQD_BIN");
    if (!bin) {
        std::printf("  real nsqd: skipped (NSQD_BIN not set)\n");
        return ok ? 0 : 1;
    }
    std::string certs = std::getenv("CG_NSQ_TEST_CERTS") ? std::getenv("CG_NSQ_TEST_CERTS") : "";
    struct mode {
        const char* name;
        bool tls, snappy, deflate;
        const char* only;
    };
    auto run_consumer = [&](const mode& m, figures& f) {
        nsqd_proc p;
        if (!start_nsqd(p, bin, n, m.tls ? certs : "")) return false;
        cg::nsq::nsq_security sec;
        sec.tls = m.tls;
        if (m.tls) sec.tls_ca_file = certs + "/ca.pem";
        sec.snappy = m.snappy;
        sec.deflate = m.deflate;
        double cpu0 = process_cpu_seconds(p.pid);
        f = in_child([&] { return consume(p.tcp, n, sec); });
        f.nsqd_cpu_per_million = (process_cpu_seconds(p.pid) - cpu0) / (static_cast<double>(n) / 1e6);
        ok = ok && f.finished == n;
        return true;
    };
    auto run_ceiling = [&](figures& f) {
        nsqd_proc p;
        if (!start_nsqd(p, bin, n, certs)) return false;
        double cpu0 = process_cpu_seconds(p.pid);
        f = in_child([&] { return raw_reader(p.tcp, n); });
        f.nsqd_cpu_per_million = (process_cpu_seconds(p.pid) - cpu0) / (static_cast<double>(n) / 1e6);
        return true;
    };

    // The ceiling and the plain consumer: paired rounds in alternating order (ceiling first, then plain
    // first, …) so load from elsewhere on the machine hits both alike; each pair gives a ratio, and the
    // medians are printed last. CG_NSQ_BENCH_ROUNDS (default 3) sets the number of pairs.
    const mode plain{"nsqd plain", false, false, false, "plain"};
    int rounds =
        std::getenv("CG_NSQ_BENCH_ROUNDS") ? std::max(1, std::atoi(std::getenv("CG_NSQ_BENCH_ROUNDS"))) : 3;
    if (want("ceiling") || want("plain")) {
        std::vector<figures> cf, pf;
        std::vector<double> ratios;
        for (int r = 0; r < rounds; ++r) {
            figures c, p;
            for (int step = 0; step < 2; ++step) {
                bool ceiling_now = (step == 0) == (r % 2 == 0);
                if (ceiling_now && want("ceiling")) {
                    if (!run_ceiling(c)) return 1;
                    cf.push_back(c);
                } else if (!ceiling_now && want("plain")) {
                    if (!run_consumer(plain, p)) return 1;
                    pf.push_back(p);
                }
            }
            char name[64];
            std::snprintf(name, sizeof name, "nsqd ceiling (raw) #%d", r + 1);
            if (c.finished > 0) print(name, c, n, 0);
            std::snprintf(name, sizeof name, "nsqd plain #%d", r + 1);
            if (p.finished > 0) print(name, p, n, c.msgs_per_s);
            if (c.msgs_per_s > 0 && p.msgs_per_s > 0) ratios.push_back(p.msgs_per_s / c.msgs_per_s);
            std::fflush(stdout);
        }
        std::printf("  medians of %d rounds:\n", rounds);
        double ceiling = cf.empty() ? 0 : median_of(cf).msgs_per_s;
        if (!cf.empty()) print("nsqd ceiling (raw)", median_of(cf), n, 0);
        if (!pf.empty()) print("nsqd plain", median_of(pf), n, ceiling);
        if (!ratios.empty())
            std::printf("  plain / ceiling, median of the paired rounds: %.0f %%\n", 100.0 * median(ratios));
    }
    for (mode m :
         {mode{"nsqd snappy", false, true, false, "snappy"},
          mode{"nsqd deflate", false, false, true, "deflate"}, mode{"nsqd TLS", true, false, false, "tls"}}) {
        if (!want(m.only)) continue;
        if (m.tls && certs.empty()) {
            std::printf("  %-22s skipped (CG_NSQ_TEST_CERTS not set)\n", m.name);
            continue;
        }
        figures f;
        if (!run_consumer(m, f)) return 1;
        print(m.name, f, n, 0);
    }
    return ok ? 0 : 1;
}
