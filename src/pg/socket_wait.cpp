// pg::connection: waiting on libpq's socket with a deadline, flushing, and reading results.
#include <poll.h>

#include "net/timeout.hpp"
#include "pg/connection_impl.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

namespace {
using descriptor = net::nothrow_t::as_default_on_t<asio::posix::stream_descriptor>;

// Which readiness came first (0 readable, 1 writable), and its error.
struct socket_readiness {
    int which = -1;
    std::error_code ec;
};

net::awaitable<void> await_readiness(descriptor& sd, asio::posix::descriptor_base::wait_type t, int id,
                                     socket_readiness& got) {
    auto [ec] = co_await sd.async_wait(t);
    if (got.which < 0) got = socket_readiness{id, ec};
}

net::awaitable<void> race_readiness(descriptor& sd, socket_readiness& got) {
    using wait_type = asio::posix::descriptor_base::wait_type;
    co_await net::race(await_readiness(sd, wait_type::wait_read, 0, got),
                       await_readiness(sd, wait_type::wait_write, 1, got));
}
}  // namespace

net::awaitable<connection::io_ready> connection::wait_io(want w, clock::time_point deadline) {
    using wait_type = asio::posix::descriptor_base::wait_type;
    int fd = PQsocket(conn_);
    if (fd < 0 || !sd_.is_open()) co_return io_ready{make_error_code(errc::connection_lost)};
    // Asio's reactor is edge-triggered: an edge that arrived while nothing waited is gone. Ask the kernel
    // for the level first, so data libpq left in the socket never makes us wait for a new edge.
    short events = w == want::read ? POLLIN : w == want::write ? POLLOUT : (POLLIN | POLLOUT);
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, 0) > 0 && p.revents) {
        bool err = p.revents & (POLLHUP | POLLERR | POLLNVAL);
        co_return io_ready{{}, (p.revents & POLLIN) || err, (p.revents & POLLOUT) || err};
    }
    if (clock::now() >= deadline) co_return io_ready{make_error_code(errc::timeout)};
    const bool timed = deadline != clock::time_point::max();

    // Readable, writable, or both raced; each bounded by the deadline (net/timeout.hpp).
    socket_readiness got;
    net::awaitable<void> waits =
        w == want::read_or_write
            ? race_readiness(sd_, got)
            : await_readiness(sd_, w == want::read ? wait_type::wait_read : wait_type::wait_write,
                              w == want::read ? 0 : 1, got);
    bool in_time = true;
    if (timed)
        in_time = co_await net::with_timeout(std::move(waits), deadline - clock::now());
    else
        co_await std::move(waits);
    int which = in_time ? got.which : 2;  // 0 readable, 1 writable, 2 timer
    std::error_code ec = got.ec;
    if (which == 2) co_return io_ready{make_error_code(errc::timeout)};
    if (ec == asio::error::operation_aborted) co_return io_ready{make_error_code(errc::canceled)};
    if (ec) co_return io_ready{make_error_code(errc::connection_lost)};
    co_return io_ready{{}, which == 0, which == 1};
}

net::awaitable<std::error_code> connection::flush(op& o) {
    for (;;) {
        int r = PQflush(conn_);
        if (r == 0) co_return std::error_code{};
        if (r < 0) co_return make_error_code(errc::connection_lost);
        // The server may be blocked writing results to us: read while we wait to write (docs/contributing.md
        // "libpq").
        auto w = co_await wait_io(want::read_or_write, o.deadline);
        if (w.ec) co_return w.ec;
        if (w.readable && !PQconsumeInput(conn_)) co_return make_error_code(errc::connection_lost);
    }
}

net::awaitable<result<pg_result*>> connection::next_result(op& o) {
    for (;;) {
        if (!PQisBusy(conn_)) co_return PQgetResult(conn_);
        auto w = co_await wait_io(want::read, o.deadline);
        if (w.ec == errc::timeout && !o.cancel_sent) {
            // Ask the server to stop, then give it a moment to answer, so the statement's outcome is known
            // (its result, or 57014 from our cancel). The connection is not reused either way (end_op).
            send_cancel();
            o.cancel_sent = true;
            o.deadline = deadline_after(opts_.cancel_grace);
            continue;
        }
        if (w.ec) co_return fail_op(w.ec, o);
        if (!PQconsumeInput(conn_)) co_return lost("reading");
    }
}

}  // namespace cg::pg
