// TLS contexts: clients always verify the peer (chain + host name); there is no switch to turn that off.
#pragma once

#include <asio/ssl/context.hpp>
#include <asio/ssl/stream.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "core/result.hpp"
#include "net/tokens.hpp"

namespace cg::net {

using tls_stream = asio::ssl::stream<tcp_socket>;

struct tls_client_options {
    // PEM bundle of trusted CAs. Empty: the system store (OpenSSL's default verify paths).
    std::string ca_file;
};

// A TLS 1.2+ client context with peer verification on. Client-side session caching is armed but stores
// nothing by itself: only a stream that carries a tls_session_cache (below) keeps the sessions it is given.
result<std::shared_ptr<asio::ssl::context>> make_tls_client_context(const tls_client_options& opts);

struct tls_server_options {
    std::string cert_file;  // PEM chain
    std::string key_file;   // PEM private key
};
result<std::shared_ptr<asio::ssl::context>> make_tls_server_context(const tls_server_options& opts);

// Prepares a client stream for a handshake with `host`: SNI (for names, not IP literals) and host name
// (or IP) verification of the peer certificate. Call before async_handshake.
result<void> prepare_tls_client(SSL* ssl, const std::string& host);
inline result<void> prepare_tls_client(tls_stream& stream, const std::string& host) {
    return prepare_tls_client(stream.native_handle(), host);
}

// Client TLS session resumption for ONE origin: keeps the latest session that origin's server issued
// (TLS 1.3 ticket or TLS 1.2 session) and offers it on the next connection, which then skips certificate
// parsing and verification and the server's signature — most of a full handshake's CPU on both sides.
// A session exists only after a full handshake whose chain and host name were verified, and a cache serves
// one origin (an http::client owns one), so a resumed connection is to the peer that was verified; a server
// that declines the session gets a full, verified handshake. Thread-safe (the new-session callback runs on
// whichever thread reads the ticket). Only with contexts from make_tls_client_context.
class tls_session_cache {
  public:
    tls_session_cache() = default;
    ~tls_session_cache();
    tls_session_cache(const tls_session_cache&) = delete;
    tls_session_cache& operator=(const tls_session_cache&) = delete;

    // Before async_handshake (after prepare_tls_client): offers the kept session, if any, and makes the
    // sessions this stream receives land here. The cache must outlive the stream.
    void attach(SSL* ssl);
    void attach(tls_stream& stream) { attach(stream.native_handle()); }
    // Keeps `s` (taking over its reference) as the session to offer next.
    void store(SSL_SESSION* s) noexcept;

  private:
    mutable std::mutex m_;
    SSL_SESSION* session_ = nullptr;
};

// After a successful handshake: the server accepted the offered session (no certificate was exchanged).
bool tls_session_resumed(SSL* ssl);
inline bool tls_session_resumed(tls_stream& stream) {
    return tls_session_resumed(stream.native_handle());
}

// Human-readable reason for a failed handshake, including OpenSSL's verify result when relevant.
std::string describe_tls_error(SSL* ssl, std::error_code ec);
inline std::string describe_tls_error(tls_stream& stream, std::error_code ec) {
    return describe_tls_error(stream.native_handle(), ec);
}

}  // namespace cg::net
