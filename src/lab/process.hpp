// Child processes the lab drives: the brokers (fake-nsqd or a real nsqd) and fake-stripe. Plain POSIX and
// blocking: call these from the offload pool (or before the main loop runs), never on the main loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/result.hpp"

namespace cg::lab {

class child {
  public:
    child() = default;
    child(child&& o) noexcept;
    child& operator=(child&& o) noexcept;
    child(const child&) = delete;
    child& operator=(const child&) = delete;
    ~child();  // SIGKILL + reap if still running

    // Starts argv[0] (a path) with stdout on a pipe (read_line) and stderr appended to `stderr_path`.
    static result<child> spawn(const std::vector<std::string>& argv, const std::string& stderr_path);

    // The next line the child writes on stdout, within `timeout`; nullopt on timeout or EOF.
    std::optional<std::string> read_line(std::chrono::milliseconds timeout);
    // Sends `sig` and waits up to `timeout` for the child to exit (then SIGKILL). Returns the wait status.
    int stop(int sig, std::chrono::milliseconds timeout);
    // True once the child has exited (it is reaped then); never blocks.
    bool exited();

    pid_t pid() const noexcept { return pid_; }

  private:
    void release() noexcept;  // SIGKILL + reap if running, close the pipe

    pid_t pid_ = -1;
    int out_ = -1;
    std::string buf_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (for the real nsqd, which prints no chosen port).
result<unsigned> free_port();

}  // namespace cg::lab
