// nsq_consume bench: the nsqd each measurement runs against, in its own process (fake-nsqd forked, or the
// real nsqd spawned with a fresh data directory), and its CPU time from /proc.
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "fake_nsqd.hpp"
#include "nsq_consume.hpp"

extern char** environ;

namespace nsq_bench {

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

nsqd_proc::~nsqd_proc() {
    if (pid > 0) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

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

}  // namespace nsq_bench
