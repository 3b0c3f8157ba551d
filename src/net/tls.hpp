// TLS contexts: clients always verify the peer (chain + host name); there is no switch to turn that off.
#pragma once

#include <asio/ssl/context.hpp>
#include <asio/ssl/stream.hpp>
#include <memory>
#include <string>

#include "core/result.hpp"
#include "net/tokens.hpp"

namespace cg::net {

using tls_stream = asio::ssl::stream<tcp_socket>;

struct tls_client_options {
    // PEM bundle of trusted CAs. Empty: the system store (OpenSSL's default verify paths).
    std::string ca_file;
};

// A TLS 1.2+ client context with peer verification on.
result<std::shared_ptr<asio::ssl::context>> make_tls_client_context(const tls_client_options& opts);

struct tls_server_options {
    std::string cert_file;  // PEM chain
    std::string key_file;   // PEM private key
};
result<std::shared_ptr<asio::ssl::context>> make_tls_server_context(const tls_server_options& opts);

// Prepares a client stream for a handshake with `host`: SNI (for names, not IP literals) and host name
// (or IP) verification of the peer certificate. Call before async_handshake.
result<void> prepare_tls_client(tls_stream& stream, const std::string& host);

// Human-readable reason for a failed handshake, including OpenSSL's verify result when relevant.
std::string describe_tls_error(tls_stream& stream, std::error_code ec);

}  // namespace cg::net
