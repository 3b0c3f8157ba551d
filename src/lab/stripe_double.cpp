#include <signal.h>

#include "lab/run_state.hpp"
#include "net/offload.hpp"

namespace cg::lab {

stripe::client_config stripe_config(std::string base, std::string key, std::string ca_file) {
    stripe::client_config sc;
    sc.api_base = std::move(base);
    sc.api_key = std::move(key);
    sc.ca_file = std::move(ca_file);
    sc.request_timeout = 10s;
    sc.connect_timeout = 2s;
    sc.retry = {2, 50ms, 200ms};
    sc.max_connections = 32;
    return sc;
}

// fake-stripe as a child process (it prints the address it listens on), and the lab's two clients of it: the
// consumers' (with retries) and the admin one (none).
net::awaitable<result<void>> lab::start_stripe() {
    std::string line;
    // (A named argv: g++ 12 cannot compile a braced list inside a co_await expression.)
    std::vector<std::string> argv{opts_.fake_stripe_bin,
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--cert",
                                  opts_.certs_dir + "/server.pem",
                                  "--key",
                                  opts_.certs_dir + "/server.key"};
    auto proc = co_await net::offload(offload_.get_executor(),
                                      spawn_and_wait_line(argv, opts_.work_dir + "/fake-stripe.log", &line));
    if (!proc)
        co_return error(std::make_error_code(std::errc::no_such_process),
                        "fake-stripe did not start: " + opts_.fake_stripe_bin);
    stripe_proc_ = std::move(*proc);
    auto at = line.rfind(' ');
    stripe_base_ = "https://" + line.substr(at + 1);

    auto sc = stripe_config(stripe_base_, stripe_key, opts_.certs_dir + "/ca.pem");
    auto cl = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!cl) co_return cl.err();
    stripe_ = std::move(*cl);
    sc.retry = {0, 50ms, 50ms};
    auto ad = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!ad) co_return ad.err();
    admin_ = std::move(*ad);
    co_return result<void>{};
}

net::awaitable<result<std::string>> lab::admin(std::string method, std::string target, std::string body) {
    auto r = co_await admin_->call(std::move(method), std::move(target), std::move(body),
                                   "lab-admin-" + std::to_string(++seq_));
    co_return body_of(std::move(r.http));
}

net::awaitable<void> lab::advance_stripe_clock(std::chrono::seconds by) {
    need(co_await admin("POST", "/_admin/clock", "advance_s=" + std::to_string(by.count())),
         "cannot move fake-stripe's clock");
}

net::awaitable<void> lab::stop_stripe() {
    if (stripe_proc_.pid() > 0)
        co_await net::offload(offload_.get_executor(), stop_child(std::move(stripe_proc_), SIGTERM));
}

}  // namespace cg::lab
