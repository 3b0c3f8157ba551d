// fake-nsqd's TCP connections: accepting, reading command lines and sized bodies with nsqd's limits, the
// writer and heartbeat coroutines, and the read loop that hands each command to exec().
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/write.hpp>

#include "core/bytes.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/server_codec.hpp"
#include "nsqd_state.hpp"

namespace cg::test::nsq {

namespace proto = cg::nsq::proto;
using namespace std::chrono;
using namespace nsqd_detail;

asio::awaitable<int> fake_nsqd::impl::fill(client& cl, std::size_t n, sclock::time_point deadline) {
    while (cl.rbuf.size() - cl.rpos < n) {
        if (cl.rpos > 0 && cl.rpos == cl.rbuf.size()) {
            cl.rbuf.clear();
            cl.rpos = 0;
        }
        char chunk[16384];
        auto left = deadline == forever ? hours(24 * 365) : deadline - sclock::now();
        if (left <= sclock::duration::zero()) co_return 1;  // deadline
        auto r = co_await net::with_timeout(cl.sock.async_read_some(asio::buffer(chunk)), left);
        if (!r) co_return 1;
        auto [ec, got] = *r;
        if (ec) co_return 2;
        cl.rbuf.append(chunk, got);
    }
    co_return 0;
}

asio::awaitable<int> fake_nsqd::impl::read_line(client& cl, std::string& line, sclock::time_point deadline) {
    for (;;) {
        auto nl = cl.rbuf.find('\n', cl.rpos);
        if (nl != std::string::npos) {
            if (nl - cl.rpos + 1 > proto::max_command_line) co_return 2;
            line.assign(cl.rbuf, cl.rpos, nl - cl.rpos + 1);
            cl.rpos = nl + 1;
            co_return 0;
        }
        if (cl.rbuf.size() - cl.rpos >= proto::max_command_line) co_return 2;
        int r = co_await fill(cl, cl.rbuf.size() - cl.rpos + 1, deadline);
        if (r) co_return r;
    }
}

asio::awaitable<std::optional<std::string>> fake_nsqd::impl::read_exact(client& cl, std::size_t n,
                                                                        sclock::time_point deadline) {
    if (co_await fill(cl, n, deadline)) co_return std::nullopt;
    std::string out = cl.rbuf.substr(cl.rpos, n);
    cl.rpos += n;
    co_return out;
}

asio::awaitable<std::optional<std::int32_t>> fake_nsqd::impl::read_len(client& cl,
                                                                       sclock::time_point deadline) {
    auto b = co_await read_exact(cl, 4, deadline);
    if (!b) co_return std::nullopt;
    co_return static_cast<std::int32_t>(load_be32(reinterpret_cast<const std::uint8_t*>(b->data())));
}

asio::awaitable<void> fake_nsqd::impl::writer(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
    for (;;) {
        while ((cl->out.empty() || self->frozen) && !cl->closed) {
            if (self->frozen) {
                co_await net::sleep_for(milliseconds(10));
                continue;
            }
            if (cl->close_after_flush) {
                self->close_client(*cl);
                break;
            }
            cl->writer_waiting = true;
            co_await cl->wake.async_wait();
            cl->writer_waiting = false;
        }
        if (cl->closed) co_return;
        if (self->latency > milliseconds(0)) co_await net::sleep_for(self->latency);
        std::swap(cl->out, cl->sending);
        auto [ec, n] = co_await asio::async_write(cl->sock, asio::buffer(cl->sending), net::nothrow);
        cl->sending.clear();
        if (ec) {
            self->close_client(*cl);
            co_return;
        }
    }
}

asio::awaitable<void> fake_nsqd::impl::heartbeats(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
    cl->hb_timer.expires_after(cl->hb);
    while (!cl->closed) {
        auto [ec] = co_await cl->hb_timer.async_wait();
        if (cl->closed) co_return;
        if (ec) continue;  // IDENTIFY re-armed the ticker
        if (!self->frozen) {
            proto::append_frame(cl->out, proto::frame_type::response, "_heartbeat_");
            cl->notify();
        }
        cl->hb_timer.expires_at(cl->hb_timer.expiry() + cl->hb);
    }
}

void fake_nsqd::impl::send_response(client& cl, std::string_view data) {
    proto::append_frame(cl.out, proto::frame_type::response, data);
    cl.notify();
}

asio::awaitable<void> fake_nsqd::impl::serve(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
    cl->hb = self->opts.heartbeat_interval;
    cl->msg_timeout = self->opts.msg_timeout;
    asio::co_spawn(self->ex, writer(self, cl), asio::detached);
    asio::co_spawn(self->ex, heartbeats(self, cl), asio::detached);
    auto magic = co_await read_exact(*cl, 4, sclock::now() + 2 * cl->hb);
    if (!magic || *magic != proto::magic_v2) {
        if (magic) {
            proto::append_frame(cl->out, proto::frame_type::error, "E_BAD_PROTOCOL");
            cl->close_after_flush = true;
            cl->notify();
        } else {
            self->close_client(*cl);
        }
        co_return;
    }
    std::string line;
    while (!cl->closed && !cl->close_after_flush) {
        auto deadline = cl->hb > milliseconds(0) ? sclock::now() + 2 * cl->hb : forever;
        int r = co_await read_line(*cl, line, deadline);
        if (cl->closed) break;
        if (r == 1) ++self->heartbeat_disconnects;
        if (r) break;
        auto params = proto::split_command(line);
        if (self->record) self->commands.emplace_back(line.substr(0, line.find_last_not_of("\r\n") + 1));
        auto err = co_await self->exec(*cl, params, deadline);
        if (cl->closed) break;
        if (err) {
            proto::append_frame(cl->out, proto::frame_type::error, err->text);
            cl->notify();
            if (err->fatal) {
                self->fatal_log.push_back(err->text);
                cl->close_after_flush = true;
                break;
            }
        }
    }
    self->remove_client(*cl);
    if (!cl->close_after_flush) self->close_client(*cl);
    cl->notify();
    self->clients.erase(cl);
}

asio::awaitable<void> fake_nsqd::impl::accept_loop(std::shared_ptr<impl> self) {
    while (!self->stopped) {
        auto cl = std::make_shared<client>(self->ex, self.get(), self->next_client_id++);
        auto [ec] = co_await self->acceptor.async_accept(cl->sock);
        if (self->stopped) co_return;
        if (ec) continue;
        std::error_code ignored;
        cl->sock.set_option(net::tcp::no_delay(true), ignored);
        auto rep = cl->sock.remote_endpoint(ignored);
        cl->remote = rep.address().to_string() + ":" + std::to_string(rep.port());
        cl->connect_ts = unix_now();
        ++self->total_connections;
        self->clients.insert(cl);
        asio::co_spawn(self->ex, serve(self, cl), asio::detached);
    }
}

}  // namespace cg::test::nsq
