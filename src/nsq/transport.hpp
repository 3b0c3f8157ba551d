// The byte stream under one nsqd connection (consumer or producer): TCP to the first of the resolved
// addresses that answers, then optionally TLS (tls_v1) and snappy or deflate stream compression, in the
// order nsqd applies them after the IDENTIFY reply. The connection and the producer read and write
// through it without knowing which layers are on.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/stream.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "core/result.hpp"
#include "net/address.hpp"
#include "net/tls.hpp"
#include "net/tokens.hpp"
#include "nsq/config.hpp"

namespace cg::nsq {

class stream_codec;

// Resolves `where` (through `hook` when set: a test seam standing in for DNS) and returns every address,
// in the resolver's order. Completes on the caller's executor.
asio::awaitable<result<std::vector<net::tcp::endpoint>>> resolve_all(const net::host_port& where,
                                                                     std::chrono::milliseconds timeout,
                                                                     const resolve_hook& hook);

class transport {
  public:
    explicit transport(asio::any_io_executor ex);
    ~transport();
    transport(const transport&) = delete;
    transport& operator=(const transport&) = delete;

    // Connects to each endpoint in turn until one accepts, all within `timeout`; the error of the last
    // attempt otherwise (named after `what`). Completes on the transport's executor.
    asio::awaitable<error> connect(std::vector<net::tcp::endpoint> eps, std::chrono::milliseconds timeout,
                                   const std::string& what);

    // TLS client handshake over the connected socket, verifying the peer (chain against `ctx`, host name
    // or IP `host`). Bounded by `timeout`. Non-blocking: runs on the executor like any other I/O.
    asio::awaitable<error> start_tls(asio::ssl::context& ctx, const std::string& host,
                                     std::chrono::milliseconds timeout);
    // From now on every byte is compressed / decompressed. Bytes the caller already read past the
    // switch point (left in its frame decoder) go back in through feed_raw() right after.
    void start_snappy();
    void start_deflate(int level);
    void feed_raw(std::string bytes);
    bool tls() const noexcept { return tls_ != nullptr; }
    const char* compression() const noexcept;

    // Reads at least one byte of (decompressed) data into `buf`. Completes on the executor; cancel with
    // cancel() or through the awaiting coroutine's cancellation slot.
    asio::awaitable<std::tuple<std::error_code, std::size_t>> read_some(asio::mutable_buffer buf);
    // Writes all of `data` (compressed first when compression is on).
    asio::awaitable<std::tuple<std::error_code, std::size_t>> write(std::string_view data);

    void set_no_delay();
    void cancel();
    void close();

  private:
    asio::awaitable<std::tuple<std::error_code, std::size_t>> raw_read(asio::mutable_buffer buf);
    asio::awaitable<std::tuple<std::error_code, std::size_t>> raw_write(asio::const_buffer buf);

    net::tcp_socket& lowest() noexcept;

    net::tcp_socket sock_;
    std::unique_ptr<net::tls_stream> tls_;
    std::error_code pending_error_;
    std::unique_ptr<stream_codec> codec_;
    std::string raw_in_, plain_in_, raw_out_;
    std::size_t plain_pos_ = 0;
};

}  // namespace cg::nsq
