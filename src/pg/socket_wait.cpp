// pg::connection: waiting on libpq's socket with a deadline, flushing, and reading results.
#include <poll.h>

#include <asio/experimental/awaitable_operators.hpp>
#include <variant>

#include "pg/connection_impl.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

net::awaitable<connection::io_ready> connection::wait_io(want w, clock::time_point deadline) {
    using namespace asio::experimental::awaitable_operators;
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
    if (timed) timer_.expires_at(deadline);
    auto first_ec = [](auto& v) { return std::visit([](auto& t) { return std::get<0>(t); }, v); };

    std::error_code ec;
    int which = 0;  // 0 readable, 1 writable, 2 timer
    if (w == want::read_or_write) {
        if (timed) {
            auto r = co_await (sd_.async_wait(wait_type::wait_read) ||
                               sd_.async_wait(wait_type::wait_write) || timer_.async_wait());
            which = static_cast<int>(r.index());
            ec = first_ec(r);
        } else {
            auto r = co_await (sd_.async_wait(wait_type::wait_read) || sd_.async_wait(wait_type::wait_write));
            which = static_cast<int>(r.index());
            ec = first_ec(r);
        }
    } else {
        auto type = w == want::read ? wait_type::wait_read : wait_type::wait_write;
        if (timed) {
            auto r = co_await (sd_.async_wait(type) || timer_.async_wait());
            which = r.index() == 0 ? (w == want::read ? 0 : 1) : 2;
            ec = first_ec(r);
        } else {
            auto [e] = co_await sd_.async_wait(type);
            which = w == want::read ? 0 : 1;
            ec = e;
        }
    }
    if (which == 2) co_return io_ready{make_error_code(ec ? errc::canceled : errc::timeout)};
    if (ec == asio::error::operation_aborted) co_return io_ready{make_error_code(errc::canceled)};
    if (ec) co_return io_ready{make_error_code(errc::connection_lost)};
    co_return io_ready{{}, which == 0, which == 1};
}

net::awaitable<std::error_code> connection::flush(op& o) {
    for (;;) {
        int r = PQflush(conn_);
        if (r == 0) co_return std::error_code{};
        if (r < 0) co_return make_error_code(errc::connection_lost);
        // The server may be blocked writing results to us: read while we wait to write (STYLE.md).
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
