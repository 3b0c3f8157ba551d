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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/bytes.hpp"
#include "fake_nsqd.hpp"
#include "metrics/registry.hpp"
#include "net/timeout.hpp"
#include "nsq/consumer.hpp"
#include "nsq/proto/commands.hpp"
#include "support/process_usage.hpp"

extern char** environ;
using namespace std::chrono;

namespace {

struct figures {
    double msgs_per_s = 0;  // steady state: first message → the 99 % mark (see steady_rate)
    double total_s = 0;     // start → last message handled (includes connect and nsqd's last flush tick)
    double cpu_per_million = 0, rss_mb = 0, drain_s = 0;
    double sys_per_million = 0;       // the kernel's part of cpu_per_million (syscalls: reads, writes, epoll)
    double waits_per_million = 0;     // voluntary context switches: how often the reader blocked for data
    double nsqd_cpu_per_million = 0;  // nsqd's own CPU over the run: what this client made it work
    long finished = 0;
};

// nsqd flushes a client's output buffer when it is full (16 KiB) or on its output_buffer_timeout ticker
// (250 ms): the last partial buffer of a run waits for the next tick, so "time to the last message" is
// quantised to 250 ms steps (±8 % on a 1.5 s run) whoever reads. Rates are therefore taken from the first
// message to the 99 % mark, for the raw reader and the consumer alike.
struct steady_clock_marks {
    long n = 0;
    steady_clock::time_point first{}, mark{};
    void on_message(long count) {
        if (count == 1) first = steady_clock::now();
        if (count == n - n / 100) mark = steady_clock::now();
    }
    double rate() const {
        auto secs = duration<double>(mark - first).count();
        return secs > 0 ? static_cast<double>(n - n / 100 - 1) / secs : 0;
    }
};

// System CPU seconds used so far by this process (the kernel's share of cg::test::cpu_seconds()).
double sys_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) / 1e6;
}
// Voluntary context switches so far (each a block in read() or epoll_wait() with nothing to do).
double waits() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_nvcsw);
}

// --- blocking helpers for the harness (never on the consumer's loop) -----------------------------------
int connect_to(std::uint16_t port) {
    for (int i = 0; i < 500; ++i) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        ::close(fd);
        ::usleep(20000);
    }
    return -1;
}

bool write_all(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
        auto n = ::write(fd, s.data() + off, s.size() - off);
        if (n <= 0) return false;
        off += static_cast<std::size_t>(n);
    }
    return true;
}

bool read_exact(int fd, char* p, std::size_t n) {
    while (n > 0) {
        auto r = ::read(fd, p, n);
        if (r <= 0) return false;
        p += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

// Reads one frame (type, data); answers heartbeats.
bool read_frame(int fd, std::int32_t& type, std::string& data) {
    for (;;) {
        char hdr[8];
        if (!read_exact(fd, hdr, 8)) return false;
        auto size = cg::load_be32(reinterpret_cast<const std::uint8_t*>(hdr));
        type = static_cast<std::int32_t>(cg::load_be32(reinterpret_cast<const std::uint8_t*>(hdr + 4)));
        data.resize(size - 4);
        if (!read_exact(fd, data.data(), data.size())) return false;
        if (type == 0 && data == "_heartbeat_") {
            if (!write_all(fd, "NOP\n")) return false;
            continue;
        }
        return true;
    }
}

std::string identify() {
    std::string out;
    cg::nsq::proto::append_magic(out);
    cg::nsq::proto::append_identify(out, R"({"feature_negotiation":true,"heartbeat_interval":30000})");
    return out;
}

bool preload(std::uint16_t port, long n) {
    int fd = connect_to(port);
    if (fd < 0) return false;
    std::int32_t t;
    std::string d;
    if (!write_all(fd, identify()) || !read_frame(fd, t, d)) return false;
    std::vector<std::string> batch(1000, std::string(200, 'x'));
    for (long sent = 0; sent < n; sent += 1000) {
        batch.resize(static_cast<std::size_t>(std::min<long>(1000, n - sent)), std::string(200, 'x'));
        std::string cmd;
        cg::nsq::proto::append_mpub(cmd, "bench", std::span<const std::string>(batch));
        if (!write_all(fd, cmd) || !read_frame(fd, t, d) || t != 0) return false;
    }
    ::close(fd);
    return true;
}

// The raw reader: IDENTIFY, SUB, RDY 2500, then parse every message frame in place from a large read
// buffer and FIN it (FINs batched per read). The fastest this nsqd can deliver to one client.
[[gnu::noinline]] figures raw_reader(std::uint16_t port, long n) {
    figures f;
    int fd = connect_to(port);
    if (fd < 0) return f;
    std::int32_t t;
    std::string d;
    write_all(fd, identify());
    read_frame(fd, t, d);
    write_all(fd, "SUB bench bench\n");
    read_frame(fd, t, d);
    auto t0 = steady_clock::now();
    double cpu0 = cg::test::cpu_seconds(), sys0 = sys_seconds(), waits0 = waits();
    write_all(fd, "RDY 2500\n");
    std::vector<char> buf(1 << 20);
    std::size_t have = 0;
    long got = 0;
    std::string fins;
    steady_clock_marks marks{n};
    while (got < n) {
        auto r = ::read(fd, buf.data() + have, buf.size() - have);
        if (r <= 0) break;
        have += static_cast<std::size_t>(r);
        std::size_t pos = 0;
        fins.clear();
        while (have - pos >= 8) {
            auto size = cg::load_be32(reinterpret_cast<const std::uint8_t*>(buf.data() + pos));
            if (have - pos < 4 + size) break;
            auto type = cg::load_be32(reinterpret_cast<const std::uint8_t*>(buf.data() + pos + 4));
            if (type == 2) {
                fins += "FIN ";
                fins.append(buf.data() + pos + 8 + 10, 16);
                fins += '\n';
                marks.on_message(++got);
            } else if (type == 0 && size == 15) {
                fins += "NOP\n";
            }
            pos += 4 + size;
        }
        std::memmove(buf.data(), buf.data() + pos, have - pos);
        have -= pos;
        if (!fins.empty()) write_all(fd, fins);
    }
    f.total_s = duration<double>(steady_clock::now() - t0).count();
    f.msgs_per_s = marks.rate();
    f.cpu_per_million = (cg::test::cpu_seconds() - cpu0) / (static_cast<double>(got) / 1e6);
    f.sys_per_million = (sys_seconds() - sys0) / (static_cast<double>(got) / 1e6);
    f.waits_per_million = (waits() - waits0) / (static_cast<double>(got) / 1e6);
    f.rss_mb = static_cast<double>(cg::test::peak_rss_kib()) / 1024.0;
    f.finished = got;
    ::close(fd);
    return f;
}

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
    double cpu0 = cg::test::cpu_seconds(), sys0 = sys_seconds(), waits0 = waits();
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
    f.sys_per_million = (sys_seconds() - sys0) / (static_cast<double>(handled) / 1e6);
    f.waits_per_million = (waits() - waits0) / (static_cast<double>(handled) / 1e6);
    f.drain_s = duration<double>(steady_clock::now() - last).count();
    f.rss_mb = static_cast<double>(cg::test::peak_rss_kib()) / 1024.0;
    f.finished = static_cast<long>(c.stats().finished);
    return f;
}

// Runs `fn` in a forked child and returns its figures (so RSS and CPU are the child's alone).
template <typename Fn>
figures in_child(Fn fn) {
    int fds[2];
    if (::pipe(fds) != 0) return {};
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(fds[0]);
        figures f = fn();
        if (::write(fds[1], &f, sizeof f) != sizeof f) std::_Exit(1);
        std::_Exit(0);
    }
    ::close(fds[1]);
    figures f;
    if (::read(fds[0], &f, sizeof f) != sizeof f) f = {};
    ::close(fds[0]);
    ::waitpid(pid, nullptr, 0);
    return f;
}

// The fake nsqd child: preloaded with n messages; writes its port to `fd`, runs until SIGTERM.
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

std::uint16_t free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// User + system CPU seconds of process `pid` so far (/proc/<pid>/stat fields 14 and 15).
double process_cpu_seconds(pid_t pid) {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (!f) return 0;
    char buf[2048];
    std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
    if (!p) return 0;
    unsigned long utime = 0, stime = 0;
    // After ")": state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime(14)
    // stime(15)
    if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
        return 0;
    return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

struct nsqd_proc {
    pid_t pid = -1;
    std::uint16_t tcp = 0;
    std::string dir;
    ~nsqd_proc() {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            ::waitpid(pid, nullptr, 0);
        }
        std::error_code ec;
        if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
};

bool start_nsqd(nsqd_proc& p, const std::string& bin, long n, const std::string& certs) {
    char tmpl[] = "/tmp/cg-bench-nsqd-XXXXXX";
    if (!::mkdtemp(tmpl)) return false;
    p.dir = tmpl;
    p.tcp = free_port();
    std::vector<std::string> args = {bin,
                                     "--tcp-address=127.0.0.1:" + std::to_string(p.tcp),
                                     "--http-address=127.0.0.1:" + std::to_string(free_port()),
                                     "--https-address=127.0.0.1:" + std::to_string(free_port()),
                                     "--data-path=" + p.dir,
                                     "--log-level=error",
                                     "--mem-queue-size=" + std::to_string(n + 1)};
    if (!certs.empty()) {
        args.push_back("--tls-cert=" + certs + "/server.pem");
        args.push_back("--tls-key=" + certs + "/server.key");
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&p.pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return false;
    return preload(p.tcp, n);
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
