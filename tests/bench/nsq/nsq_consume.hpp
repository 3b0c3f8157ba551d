// The nsq_consume bench's parts (nsq_consume.cpp runs them): the figures of a run, the raw reader that
// measures nsqd's deliverable ceiling with blocking sockets (raw_reader.cpp), and the child processes
// (fake-nsqd, real nsqd) each measurement runs against (nsqd_procs.cpp).
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace nsq_bench {

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
    std::chrono::steady_clock::time_point first{}, mark{};
    void on_message(long count) {
        if (count == 1) first = std::chrono::steady_clock::now();
        if (count == n - n / 100) mark = std::chrono::steady_clock::now();
    }
    double rate() const {
        auto secs = std::chrono::duration<double>(mark - first).count();
        return secs > 0 ? static_cast<double>(n - n / 100 - 1) / secs : 0;
    }
};

// System CPU seconds used so far by this process (the kernel's share of cg::test::cpu_seconds()).
double sys_seconds();
// Voluntary context switches so far (each a block in read() or epoll_wait() with nothing to do).
double waits();

// Publishes n 200-byte messages to topic "bench" over nsqd's TCP protocol (blocking; the harness only).
bool preload(std::uint16_t port, long n);
// The raw reader: IDENTIFY, SUB, RDY 2500, then parse every message frame in place from a large read
// buffer and FIN it (FINs batched per read). The fastest this nsqd can deliver to one client.
figures raw_reader(std::uint16_t port, long n);

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
[[noreturn]] void run_fake(int fd, long n);
std::uint16_t free_port();
// User + system CPU seconds of process `pid` so far (/proc/<pid>/stat fields 14 and 15).
double process_cpu_seconds(pid_t pid);

struct nsqd_proc {
    pid_t pid = -1;
    std::uint16_t tcp = 0;
    std::string dir;
    ~nsqd_proc();
};

// A real nsqd (`bin`) in its own process with n messages preloaded; TLS when `certs` is not empty.
bool start_nsqd(nsqd_proc& p, const std::string& bin, long n, const std::string& certs);

}  // namespace nsq_bench
