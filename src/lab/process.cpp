#include "lab/process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <thread>

extern char** environ;

namespace cg::lab {

namespace {
error sys_error(const std::string& what) {
    return error(std::error_code(errno, std::generic_category()), what);
}
}  // namespace

child::child(child&& o) noexcept : pid_(o.pid_), out_(o.out_), buf_(std::move(o.buf_)) {
    o.pid_ = -1;
    o.out_ = -1;
}

child& child::operator=(child&& o) noexcept {
    if (this != &o) {
        release();
        pid_ = o.pid_;
        out_ = o.out_;
        buf_ = std::move(o.buf_);
        o.pid_ = -1;
        o.out_ = -1;
    }
    return *this;
}

child::~child() {
    release();
}

void child::release() noexcept {
    if (pid_ > 0) stop(SIGKILL, std::chrono::milliseconds(2000));
    if (out_ >= 0) ::close(out_);
    out_ = -1;
}

result<child> child::spawn(const std::vector<std::string>& argv, const std::string& stderr_path) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return sys_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    child c;
    int rc = ::posix_spawn(&c.pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    if (rc != 0) {
        ::close(fds[0]);
        c.pid_ = -1;
        errno = rc;
        return sys_error("spawn " + argv[0]);
    }
    c.out_ = fds[0];
    return c;
}

std::optional<std::string> child::read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (auto nl = buf_.find('\n'); nl != std::string::npos) {
            std::string line = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            return line;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        if (left.count() <= 0 || out_ < 0) return std::nullopt;
        pollfd p{out_, POLLIN, 0};
        int n = ::poll(&p, 1, static_cast<int>(left.count()));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return std::nullopt;
        char tmp[512];
        auto got = ::read(out_, tmp, sizeof tmp);
        if (got <= 0) return std::nullopt;
        buf_.append(tmp, static_cast<std::size_t>(got));
    }
}

int child::stop(int sig, std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return 0;
    ::kill(pid_, sig);
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) break;
        if (std::chrono::steady_clock::now() >= deadline) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
}

bool child::exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    pid_ = -1;
    return true;
}

result<unsigned> free_port() {
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return sys_error("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        auto e = sys_error("bind");
        ::close(s);
        return e;
    }
    ::close(s);
    return static_cast<unsigned>(ntohs(a.sin_port));
}

}  // namespace cg::lab
