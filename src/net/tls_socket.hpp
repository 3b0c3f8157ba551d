// A TLS client connection in which OpenSSL reads and writes the non-blocking socket itself (SSL_set_fd).
// asio::ssl::stream moves every record through buffers of its own and a BIO pair: four 17 KiB buffers per
// connection, touched once used and held for the connection's life, idle or waiting. Here a connection holds
// OpenSSL's record buffers only, and OpenSSL frees them whenever they are empty (SSL_MODE_RELEASE_BUFFERS):
// a connection waiting for its answer, or idle in a pool, holds its SSL state alone.
#pragma once

#include <openssl/ssl.h>

#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/compose.hpp>
#include <asio/post.hpp>
#include <asio/ssl/context.hpp>
#include <cstddef>
#include <system_error>

#include "net/tokens.hpp"

namespace cg::net {

class tls_client_socket {
  public:
    using executor_type = tcp_socket::executor_type;

    tls_client_socket(asio::any_io_executor ex, asio::ssl::context& ctx);
    ~tls_client_socket();
    tls_client_socket(const tls_client_socket&) = delete;
    tls_client_socket& operator=(const tls_client_socket&) = delete;

    executor_type get_executor() noexcept { return sock_.get_executor(); }
    tcp_socket& next_layer() noexcept { return sock_; }
    SSL* native_handle() noexcept { return ssl_; }

    // The client handshake, once the socket is connected. Completion: void(std::error_code).
    template <typename Token>
    auto async_handshake(Token&& token) {
        return asio::async_compose<Token, void(std::error_code)>(io_op<handshake_step, false>{*this, {}},
                                                                 token, sock_);
    }
    // AsyncReadStream / AsyncWriteStream: at least one byte (EOF: asio::error::eof after close_notify,
    // asio::ssl::error::stream_truncated when the peer closed without one). Completion:
    // void(std::error_code, std::size_t).
    template <typename MutableBuffers, typename Token>
    auto async_read_some(const MutableBuffers& buffers, Token&& token) {
        return asio::async_compose<Token, void(std::error_code, std::size_t)>(
            io_op<read_step, true>{*this, {first_buffer(buffers)}}, token, sock_);
    }
    template <typename ConstBuffers, typename Token>
    auto async_write_some(const ConstBuffers& buffers, Token&& token) {
        return asio::async_compose<Token, void(std::error_code, std::size_t)>(
            io_op<write_step, true>{*this, {first_buffer(buffers)}}, token, sock_);
    }

  private:
    enum class want { done, read, write };
    // One call into OpenSSL; `r` is its return value. done (with `ec` set on failure) or the socket readiness
    // it waits for.
    want outcome(int r, std::error_code& ec);
    // Before each call into OpenSSL: the socket attached (once), the thread's error queue and errno clear,
    // as SSL_get_error needs them.
    void before_call();

    struct handshake_step {
        int operator()(SSL* ssl) const { return SSL_connect(ssl); }
    };
    struct read_step {
        asio::mutable_buffer b;
        int operator()(SSL* ssl) const { return SSL_read(ssl, b.data(), clamp(b.size())); }
        std::size_t size() const { return b.size(); }
    };
    struct write_step {
        asio::const_buffer b;
        int operator()(SSL* ssl) const { return SSL_write(ssl, b.data(), clamp(b.size())); }
        std::size_t size() const { return b.size(); }
    };
    static int clamp(std::size_t n) { return n > 1u << 30 ? 1 << 30 : static_cast<int>(n); }

    template <typename Buffers>
    static auto first_buffer(const Buffers& b) {
        return *asio::buffer_sequence_begin(b);
    }

    // Calls the step until OpenSSL no longer waits for the socket; completes through a post when that is at
    // once, so a completion never runs inside its initiation.
    template <typename Step, bool Sized>
    struct io_op {
        tls_client_socket& s;
        Step step;
        bool waited = false, finished = false;
        std::error_code ec{};
        std::size_t n = 0;

        template <typename Self>
        void operator()(Self& self, std::error_code wait_ec = {}) {
            if (!finished) {
                if (wait_ec) {
                    ec = wait_ec;
                } else if constexpr (Sized) {
                    if (step.size() != 0) {
                        s.before_call();
                        int r = step(s.ssl_);
                        auto w = s.outcome(r, ec);
                        if (w != want::done) return wait(self, w);
                        if (r > 0) n = static_cast<std::size_t>(r);
                    }
                } else {
                    s.before_call();
                    auto w = s.outcome(step(s.ssl_), ec);
                    if (w != want::done) return wait(self, w);
                }
                finished = true;
                if (!waited) return asio::post(s.sock_.get_executor(), std::move(self));
            }
            if constexpr (Sized)
                self.complete(ec, n);
            else
                self.complete(ec);
        }

        template <typename Self>
        void wait(Self& self, want w) {
            waited = true;
            s.sock_.async_wait(w == want::read ? tcp::socket::wait_read : tcp::socket::wait_write,
                               std::move(self));
        }
    };

    tcp_socket sock_;
    SSL* ssl_;
    bool attached_ = false;
};

}  // namespace cg::net
