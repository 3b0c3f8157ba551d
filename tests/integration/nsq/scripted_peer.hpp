// A scripted peer speaking nsqd's bytes for one connection, for what fake-nsqd does not model (it has no
// TLS or compression): the handshake and the compressed transport meet exact byte sequences.
#pragma once

#include <asio/read.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "core/bytes.hpp"
#include "net/tokens.hpp"
#include "nsq/handshake.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/transport.hpp"

namespace nsqtest {

using namespace std::chrono;

// The server side of one connection: accepts, reads magic and IDENTIFY, answers with `identify` (JSON),
// then writes `after` (the bytes nsqd would send next, already in their final framing) and keeps the
// socket open until the client closes.
struct scripted_peer {
    explicit scripted_peer(asio::any_io_executor ex)
        : acceptor(ex, {asio::ip::make_address("127.0.0.1"), 0}) {}
    cg::net::tcp_acceptor acceptor;
    bool done = false;

    std::uint16_t port() const { return acceptor.local_endpoint().port(); }

    static asio::awaitable<void> serve(scripted_peer* self, std::string identify, std::string after) {
        auto [aec, sock] = co_await self->acceptor.async_accept();
        if (aec) co_return;
        std::string head(4 + 9 + 4, '\0');  // "  V2" "IDENTIFY\n" [size]
        auto [ec1, n1] =
            co_await asio::async_read(sock, asio::buffer(head), asio::transfer_all(), cg::net::nothrow);
        if (ec1) co_return;
        auto size = cg::load_be32(reinterpret_cast<const std::uint8_t*>(head.data() + 13));
        std::string body(size, '\0');
        auto [ec2, n2] =
            co_await asio::async_read(sock, asio::buffer(body), asio::transfer_all(), cg::net::nothrow);
        if (ec2) co_return;
        std::string out;
        cg::nsq::proto::append_frame(out, cg::nsq::proto::frame_type::response, identify);
        out += after;
        co_await asio::async_write(sock, asio::buffer(out), cg::net::nothrow);
        char sink[4096];
        for (;;) {
            auto [ec, n] = co_await sock.async_read_some(asio::buffer(sink));
            if (ec) break;
        }
        self->done = true;
    }
};

inline std::string frame(cg::nsq::proto::frame_type t, std::string_view data) {
    std::string out;
    cg::nsq::proto::append_frame(out, t, data);
    return out;
}

inline asio::awaitable<cg::result<cg::nsq::proto::identify_response>> run_handshake(
    cg::nsq::transport& t, cg::nsq::proto::frame_decoder& d, cg::nsq::nsq_security sec, std::uint16_t port) {
    std::vector<cg::net::tcp::endpoint> eps{{asio::ip::make_address("127.0.0.1"), port}};
    if (auto e = co_await t.connect(eps, seconds(2), "peer")) co_return e;
    cg::nsq::handshake_options o;
    o.identify.heartbeat_interval_ms = 1000;
    o.security = &sec;
    o.what = "peer";
    cg::logger log;
    co_return co_await cg::nsq::handshake(t, d, o, steady_clock::now() + seconds(3), log);
}

}  // namespace nsqtest
