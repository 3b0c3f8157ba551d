#include "nsq/transport.hpp"

#include <asio/connect.hpp>
#include <asio/write.hpp>
#include <cstring>
#include <utility>

#include "net/error.hpp"
#include "net/resolve.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "nsq/proto/compression.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq {

// One direction pair of stream compression.
class stream_codec {
  public:
    virtual ~stream_codec() = default;
    virtual const char* name() const noexcept = 0;
    // Appends a bounded amount (proto::default_max_decoded); pending() says more is waiting inside.
    virtual result<void> decode(std::string_view in, std::string& out) = 0;
    virtual bool pending() const noexcept = 0;
    virtual void encode(std::string_view in, std::string& out) = 0;
};

namespace {

class snappy_codec final : public stream_codec {
  public:
    const char* name() const noexcept override { return "snappy"; }
    result<void> decode(std::string_view in, std::string& out) override { return dec_.decode(in, out); }
    bool pending() const noexcept override { return dec_.pending(); }
    void encode(std::string_view in, std::string& out) override { enc_.encode(in, out); }

  private:
    proto::snappy_encoder enc_;
    proto::snappy_decoder dec_;
};

class deflate_codec final : public stream_codec {
  public:
    explicit deflate_codec(int level) : enc_(level) {}
    const char* name() const noexcept override { return "deflate"; }
    result<void> decode(std::string_view in, std::string& out) override { return dec_.decode(in, out); }
    bool pending() const noexcept override { return dec_.pending(); }
    void encode(std::string_view in, std::string& out) override { enc_.encode(in, out); }

  private:
    proto::deflate_encoder enc_;
    proto::deflate_decoder dec_;
};

}  // namespace

asio::awaitable<result<std::vector<net::tcp::endpoint>>> resolve_all(const net::host_port& where,
                                                                     std::chrono::milliseconds timeout,
                                                                     const resolve_hook& hook) {
    std::vector<net::tcp::endpoint> out;
    if (hook) {
        for (const auto& a : hook(where.host)) {
            std::error_code ec;
            auto ip = asio::ip::make_address(a, ec);
            if (!ec) out.emplace_back(ip, where.port);
        }
        if (out.empty()) co_return error(net::errc::resolve_failed, "no address for " + where.host);
        co_return out;
    }
    auto r = co_await net::resolve(where.host, std::to_string(where.port), timeout);
    if (!r) co_return r.err();
    for (const auto& e : *r) out.push_back(e.endpoint());
    co_return out;
}

transport::transport(asio::any_io_executor ex) : sock_(ex) {}
transport::~transport() = default;

asio::awaitable<error> transport::connect(std::vector<net::tcp::endpoint> eps,
                                          std::chrono::milliseconds timeout, const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    error last(net::errc::resolve_failed, "no address for " + what);
    for (const auto& ep : eps) {
        auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) break;
        std::error_code ignored;
        sock_.close(ignored);
        auto c = co_await net::with_timeout(sock_.async_connect(ep), left);
        if (!c) co_return error(errc::timeout, "connect to " + what + " timed out");
        auto [ec] = *c;
        if (!ec) co_return error{};
        last = error(ec, "connect to " + what + " (" + ep.address().to_string() + ")");
    }
    co_return last;
}

asio::awaitable<error> transport::start_tls(asio::ssl::context& ctx, const std::string& host,
                                            std::chrono::milliseconds timeout) {
    // The socket moves into the TLS stream; lowest() reaches it from now on.
    tls_ = std::make_unique<net::tls_stream>(std::move(sock_), ctx);
    if (auto p = net::prepare_tls_client(*tls_, host); !p) co_return p.err();
    auto r = co_await net::with_timeout(tls_->async_handshake(asio::ssl::stream_base::client), timeout);
    if (!r) co_return error(errc::timeout, "TLS handshake with " + host + " timed out");
    auto [ec] = *r;
    if (ec) co_return error(ec, "TLS handshake with " + host + ": " + net::describe_tls_error(*tls_, ec));
    co_return error{};
}

net::tcp_socket& transport::lowest() noexcept {
    return tls_ ? tls_->next_layer() : sock_;
}

void transport::start_snappy() {
    codec_ = std::make_unique<snappy_codec>();
}
void transport::start_deflate(int level) {
    codec_ = std::make_unique<deflate_codec>(level);
}
const char* transport::compression() const noexcept {
    return codec_ ? codec_->name() : "none";
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> transport::raw_read(asio::mutable_buffer buf) {
    if (tls_) co_return co_await tls_->async_read_some(buf, net::nothrow);
    co_return co_await sock_.async_read_some(buf);
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> transport::raw_write(asio::const_buffer buf) {
    if (tls_) co_return co_await asio::async_write(*tls_, buf, net::nothrow);
    co_return co_await asio::async_write(sock_, buf, net::nothrow);
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> transport::read_some(asio::mutable_buffer buf) {
    if (pending_error_) co_return std::tuple(std::exchange(pending_error_, {}), std::size_t{0});
    if (!codec_ && plain_pos_ >= plain_in_.size()) co_return co_await raw_read(buf);
    while (plain_pos_ >= plain_in_.size()) {
        plain_in_.clear();
        plain_pos_ = 0;
        // The decoder hands out a bounded amount per call: drain what it still holds before reading more.
        if (codec_->pending()) {
            if (auto d = codec_->decode({}, plain_in_); !d)
                co_return std::tuple(d.err().code, std::size_t{0});
            continue;
        }
        raw_in_.resize(64 * 1024);
        auto [ec, n] = co_await raw_read(asio::buffer(raw_in_));
        if (ec) co_return std::tuple(ec, std::size_t{0});
        if (auto d = codec_->decode(std::string_view(raw_in_.data(), n), plain_in_); !d)
            co_return std::tuple(d.err().code, std::size_t{0});
    }
    auto n = std::min(buf.size(), plain_in_.size() - plain_pos_);
    std::memcpy(buf.data(), plain_in_.data() + plain_pos_, n);
    plain_pos_ += n;
    co_return std::tuple(std::error_code{}, n);
}

void transport::feed_raw(std::string bytes) {
    if (bytes.empty()) return;
    if (!codec_) {
        plain_in_.append(bytes);
        return;
    }
    if (auto d = codec_->decode(bytes, plain_in_); !d) pending_error_ = d.err().code;
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> transport::write(std::string_view data) {
    if (!codec_) co_return co_await raw_write(asio::buffer(data.data(), data.size()));
    raw_out_.clear();
    codec_->encode(data, raw_out_);
    auto [ec, n] = co_await raw_write(asio::buffer(raw_out_));
    co_return std::tuple(ec, ec ? std::size_t{0} : data.size());
}

void transport::set_no_delay() {
    std::error_code ignored;
    lowest().set_option(net::tcp::no_delay(true), ignored);
}

void transport::cancel() {
    std::error_code ignored;
    lowest().cancel(ignored);
}

void transport::close() {
    std::error_code ignored;
    lowest().shutdown(net::tcp::socket::shutdown_both, ignored);
    lowest().close(ignored);
}

}  // namespace cg::nsq
