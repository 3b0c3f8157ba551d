#include "net/resolve.hpp"

#include <asio/this_coro.hpp>
#include <memory>

#include "net/error.hpp"
#include "net/timeout.hpp"

namespace cg::net {

namespace {

// Outlives the awaiting coroutine when the lookup hangs: the lookup's handler holds it.
struct pending_lookup {
    explicit pending_lookup(const asio::any_io_executor& ex) : resolver(ex), wake(ex) {}
    tcp::resolver resolver;
    steady_timer wake;
    std::error_code ec;
    resolve_results results;
    bool done = false;
};

}  // namespace

awaitable<result<resolve_results>> resolve_with(resolve_initiator start, std::string what,
                                                std::chrono::steady_clock::duration timeout) {
    auto ex = co_await asio::this_coro::executor;
    auto st = std::make_shared<pending_lookup>(ex);
    st->wake.expires_after(timeout);
    // The resolver runs on our executor, so its handler and this coroutine never touch `st` at once.
    start(st->resolver, [st](std::error_code ec, resolve_results r) {
        st->ec = ec;
        st->results = std::move(r);
        st->done = true;
        st->wake.cancel();
    });
    auto [wec] = co_await st->wake.async_wait();  // the deadline, the answer, or our own cancellation
    if (!st->done) {
        st->resolver.cancel();  // drops the lookup if it has not started yet; a running one is abandoned
        if (wec) co_return error(asio::error::operation_aborted, "resolve " + what + ": cancelled");
        co_return error(errc::timeout, "resolve " + what + ": no answer within " + describe_timeout(timeout));
    }
    if (st->ec) co_return error(st->ec, "resolve " + what + ": " + st->ec.message());
    if (st->results.empty()) co_return error(errc::resolve_failed, "resolve " + what + ": no addresses");
    co_return std::move(st->results);
}

awaitable<result<resolve_results>> resolve(std::string host, std::string service,
                                           std::chrono::steady_clock::duration timeout) {
    std::string what = host;
    // Named, not a temporary inside the co_await: g++ 12 destroys such temporaries twice.
    resolve_initiator start = [host = std::move(host), service = std::move(service)](tcp::resolver& r,
                                                                                     resolve_handler h) {
        r.async_resolve(host, service, std::move(h));
    };
    auto r = co_await resolve_with(std::move(start), std::move(what), timeout);
    co_return r;
}

}  // namespace cg::net
