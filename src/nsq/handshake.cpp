#include "nsq/handshake.hpp"

#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq {

using sclock = std::chrono::steady_clock;

result<std::shared_ptr<asio::ssl::context>> make_nsq_tls_context(const nsq_security& s) {
    if (!s.tls) return std::shared_ptr<asio::ssl::context>{};
    auto ctx = net::make_tls_client_context(net::tls_client_options{s.tls_ca_file});
    if (!ctx) return ctx.err();
    if (!s.tls_cert_file.empty()) {
        std::error_code ec;
        (*ctx)->use_certificate_chain_file(s.tls_cert_file, ec);
        if (ec)
            return error(errc::bad_config,
                         "TLS client certificate '" + s.tls_cert_file + "': " + ec.message());
        (*ctx)->use_private_key_file(s.tls_key_file, asio::ssl::context::pem, ec);
        if (ec) return error(errc::bad_config, "TLS client key '" + s.tls_key_file + "': " + ec.message());
    }
    return *ctx;
}

asio::awaitable<result<proto::frame>> read_frame(transport& t, proto::frame_decoder& d,
                                                 sclock::time_point deadline, const std::string& what) {
    for (;;) {
        proto::frame f;
        auto st = d.next(f);
        if (st == proto::decode_status::frame) co_return f;
        if (st == proto::decode_status::error) co_return d.last_error();
        auto left = deadline - sclock::now();
        if (left <= sclock::duration::zero())
            co_return error(errc::timeout, "handshake with " + what + " timed out");
        auto area = d.prepare();
        auto r = co_await net::with_timeout(t.read_some(asio::buffer(area.data(), area.size())), left);
        if (!r) co_return error(errc::timeout, "handshake with " + what + " timed out");
        auto [ec, n] = *r;
        if (ec)
            co_return error(ec == asio::error::eof ? make_error_code(errc::connection_closed) : ec,
                            "handshake with " + what);
        d.commit(n);
    }
}

namespace {

asio::awaitable<error> send(transport& t, const std::string& bytes, const char* what) {
    auto [ec, n] = co_await t.write(bytes);
    if (ec) co_return error(ec, std::string("writing ") + what);
    co_return error{};
}

bool is_heartbeat(const proto::frame& f) {
    return f.type == proto::frame_type::response && f.data == "_heartbeat_";
}

// Reads the OK nsqd sends after switching an upgrade on. nsqd's heartbeat ticker (restarted by IDENTIFY)
// writes from another goroutine, serialised with the upgrade only by the client's write lock, which the
// TLS handshake holds (protocol_v2.go IDENTIFY, client_v2.go UpgradeTLS/UpgradeSnappy/UpgradeDeflate):
// a handshake that outlasts the heartbeat interval lets a `_heartbeat_` in, after the switch and before
// the OK, in the same framing as the OK — skipped here. It is not answered: nsqd reads no command until
// IDENTIFY has returned, and a NOP written before a later compression switch would reach nsqd's
// decompressor uncompressed; the next command (AUTH or SUB) answers it.
asio::awaitable<error> expect_ok(transport& t, proto::frame_decoder& d, sclock::time_point deadline,
                                 const std::string& what, const char* step) {
    for (;;) {
        auto f = co_await read_frame(t, d, deadline, what);
        if (!f) co_return error(f.err().code, std::string(step) + ": " + f.err().message);
        if (is_heartbeat(*f)) continue;
        if (f->type == proto::frame_type::error)
            co_return error(errc::server_error, std::string(step) + ": " + std::string(f->data));
        if (f->type != proto::frame_type::response || f->data != "OK")
            co_return error(errc::bad_response, std::string(step) + ": expected OK from " + what);
        co_return error{};
    }
}

// nsqd answers AUTH only once its auth server has (an HTTP request of its own, as long as that takes),
// while its heartbeat ticker keeps writing: skip heartbeats, answering each with NOP as on a subscribed
// connection, until the AUTH reply.
asio::awaitable<result<proto::frame>> read_auth_reply(transport& t, proto::frame_decoder& d,
                                                      sclock::time_point deadline, const std::string& what) {
    for (;;) {
        auto f = co_await read_frame(t, d, deadline, what);
        if (!f || !is_heartbeat(*f)) co_return f;
        std::string nop;
        proto::append_nop(nop);
        if (auto e = co_await send(t, nop, "NOP")) co_return e;
    }
}

}  // namespace

asio::awaitable<result<proto::identify_response>> handshake(transport& t, proto::frame_decoder& d,
                                                            const handshake_options& o,
                                                            sclock::time_point deadline, logger& log) {
    static const nsq_security none;
    const nsq_security& sec = o.security ? *o.security : none;
    auto id = o.identify;
    id.tls_v1 = sec.tls;
    id.snappy = sec.snappy;
    id.deflate = sec.deflate;
    id.deflate_level = sec.deflate ? sec.deflate_level : 0;
    std::string out;
    proto::append_magic(out);
    proto::append_identify(out, proto::to_json(id));
    if (auto e = co_await send(t, out, "IDENTIFY")) co_return e;

    auto f = co_await read_frame(t, d, deadline, o.what);
    if (!f) co_return f.err();
    if (f->type == proto::frame_type::error)
        co_return error(errc::server_error, "IDENTIFY: " + std::string(f->data));
    auto neg = proto::parse_identify_response(f->data);
    if (!neg) co_return neg.err();
    if (neg->tls_v1 != sec.tls)
        co_return error(errc::unsupported,
                        sec.tls
                            ? "nsqd " + o.what + " does not offer TLS (start it with --tls-cert/--tls-key)"
                            : "nsqd enabled TLS we did not ask for");
    if (neg->snappy != sec.snappy || neg->deflate != sec.deflate)
        co_return error(errc::unsupported, (sec.snappy || sec.deflate)
                                               ? "nsqd " + o.what + " refused the compression asked for"
                                               : "nsqd enabled compression we did not ask for");

    if (neg->tls_v1) {
        if (d.buffered() != 0)
            co_return error(errc::bad_response, "bytes from nsqd before the TLS handshake");
        if (!o.tls) co_return error(errc::bad_config, "TLS asked for without a TLS context");
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - sclock::now());
        if (auto e = co_await t.start_tls(*o.tls, o.tls_host, std::max(left, std::chrono::milliseconds(1))))
            co_return e;
        if (auto e = co_await expect_ok(t, d, deadline, o.what, "TLS upgrade")) co_return e;
    }
    if (neg->snappy || neg->deflate) {
        // nsqd compresses right after the IDENTIFY reply (or the TLS OK): bytes read past it are compressed.
        if (neg->snappy) {
            t.start_snappy();
        } else {
            t.start_deflate(static_cast<int>(neg->deflate_level));
        }
        t.feed_raw(d.take_buffered());
        if (auto e = co_await expect_ok(t, d, deadline, o.what, "compression upgrade")) co_return e;
    }
    if (neg->auth_required) {
        if (sec.auth_secret.empty())
            co_return error(errc::unsupported,
                            "nsqd " + o.what +
                                " requires AUTH: give --nsq-auth-secret-file or CHARGEGUARD_NSQ_AUTH_SECRET");
        out.clear();
        proto::append_auth(out, sec.auth_secret);
        if (auto e = co_await send(t, out, "AUTH")) co_return e;
        auto a = co_await read_auth_reply(t, d, deadline, o.what);
        if (!a) co_return a.err();
        if (a->type == proto::frame_type::error)
            co_return error(errc::server_error, "AUTH: " + std::string(a->data));
        auto ar = proto::parse_auth_response(a->data);
        if (!ar) co_return ar.err();
        log.info("authenticated to nsqd", {{"nsqd", o.what},
                                           {"identity", ar->identity},
                                           {"identity_url", ar->identity_url},
                                           {"permission_count", ar->permission_count}});
    }
    co_return *neg;
}

}  // namespace cg::nsq
