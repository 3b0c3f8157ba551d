// fake-stripe over TLS on its own thread and io_context, like a remote server, for benchmarks that measure a
// client of it (or a proxy in front of it) in this process.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "net/tls.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

namespace cg::test {

struct fake_stripe_thread {
    asio::io_context io{1};
    std::unique_ptr<fake::fake_stripe> fake;
    std::thread t;
    std::uint16_t port = 0;
    std::atomic<long> tid{0};  // the thread's Linux id (its CPU time: /proc/self/task/<tid>/stat)

    // Listens on 127.0.0.1 (a free port) with `certs`/server.pem and server.key; returns once the thread
    // runs.
    explicit fake_stripe_thread(const std::string& certs) {
        auto tls = net::make_tls_server_context({certs + "/server.pem", certs + "/server.key"});
        if (!tls) throw std::runtime_error(tls.err().describe());
        fake = std::make_unique<fake::fake_stripe>(io.get_executor(), *tls, logger(), 4096);
        auto ep = fake->listen({"127.0.0.1", 0});
        if (!ep) throw std::runtime_error(ep.err().describe());
        port = ep->port();
        fake->start();
        t = std::thread([this] {
            tid = static_cast<long>(::syscall(SYS_gettid));
            io.run();
        });
        while (tid == 0) std::this_thread::yield();
    }
    ~fake_stripe_thread() {
        asio::post(io, [this] { fake->stop(); });
        io.stop();
        t.join();
    }
    fake_stripe_thread(const fake_stripe_thread&) = delete;
    fake_stripe_thread& operator=(const fake_stripe_thread&) = delete;

    // Runs `fn` on the fake's thread and waits for it; returns what it returns.
    template <typename Fn>
    auto on_fake(Fn fn) {
        std::packaged_task<decltype(fn())()> task(std::move(fn));
        auto fut = task.get_future();
        asio::post(io, [&task] { task(); });
        return fut.get();
    }
};

}  // namespace cg::test
