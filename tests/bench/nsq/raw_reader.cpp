// nsq_consume bench: the harness's blocking helpers (never on the consumer's loop), the preload, and the raw
// reader that measures nsqd's deliverable ceiling.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/bytes.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq_consume.hpp"
#include "support/process_usage.hpp"

namespace nsq_bench {

using namespace std::chrono;

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

namespace {

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

}  // namespace

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

}  // namespace nsq_bench
