#include "net/tls_socket.hpp"

#include <openssl/err.h>

#include <asio/ssl/error.hpp>
#include <cerrno>
#include <new>

namespace cg::net {

tls_client_socket::tls_client_socket(asio::any_io_executor ex, asio::ssl::context& ctx)
    : sock_(std::move(ex)), ssl_(SSL_new(ctx.native_handle())) {
    if (!ssl_) throw std::bad_alloc();
    // A write that fills the socket returns what it wrote; a retried write may come from another address
    // (asio::async_write's next slice of the same bytes), as asio::ssl::stream sets them.
    SSL_set_mode(
        ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
}

tls_client_socket::~tls_client_socket() {
    SSL_free(ssl_);  // the socket BIO does not own the descriptor: sock_ closes it
}

void tls_client_socket::before_call() {
    if (!attached_) {
        attached_ = true;
        std::error_code ignored;
        sock_.non_blocking(true, ignored);  // OpenSSL's reads and writes return at once; the waits are Asio's
        SSL_set_fd(ssl_, static_cast<int>(sock_.native_handle()));
    }
    ERR_clear_error();
    errno = 0;
}

tls_client_socket::want tls_client_socket::outcome(int r, std::error_code& ec) {
    if (r > 0) return want::done;
    const int sys = errno;
    switch (SSL_get_error(ssl_, r)) {
        case SSL_ERROR_WANT_READ:
            return want::read;
        case SSL_ERROR_WANT_WRITE:
            return want::write;
        case SSL_ERROR_ZERO_RETURN:
            ec = asio::error::eof;  // close_notify
            break;
        case SSL_ERROR_SYSCALL:
            if (unsigned long e = ERR_get_error())
                ec = std::error_code(static_cast<int>(e), asio::error::get_ssl_category());
            else if (sys != 0)
                ec = std::error_code(sys, asio::error::get_system_category());
            else
                ec = asio::ssl::error::stream_truncated;  // EOF without close_notify
            break;
        default: {
            unsigned long e = ERR_peek_last_error();
            if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
                ec = asio::ssl::error::stream_truncated;
            else
                ec = std::error_code(static_cast<int>(e), asio::error::get_ssl_category());
            break;
        }
    }
    ERR_clear_error();
    return want::done;
}

}  // namespace cg::net
