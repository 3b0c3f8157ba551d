#include "net/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <asio/ip/address.hpp>

#include "net/error.hpp"

namespace cg::net {
namespace {

std::string openssl_errors() {
    std::string out;
    while (unsigned long e = ERR_get_error()) {
        char buf[256];
        ERR_error_string_n(e, buf, sizeof buf);
        if (!out.empty()) out += "; ";
        out += buf;
    }
    return out;
}

bool is_ip_literal(const std::string& host) {
    std::error_code ec;
    (void)asio::ip::make_address(host, ec);
    return !ec;
}

// SSL ex_data slot holding the stream's tls_session_cache (absent: the stream keeps no sessions).
int cache_index() {
    static const int idx = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
    return idx;
}

// OpenSSL hands over a new session (after a verified full handshake, or a TLS 1.3 ticket read later). The
// cache keeps a copy: the object given is still the connection's own, and closing that connection without
// close_notify (how an idle keep-alive connection is dropped) marks it not resumable. Returns 0: OpenSSL
// keeps its reference.
int on_new_session(SSL* ssl, SSL_SESSION* s) {
    auto* cache = static_cast<tls_session_cache*>(SSL_get_ex_data(ssl, cache_index()));
    if (!cache) return 0;
    if (SSL_SESSION* copy = SSL_SESSION_dup(s)) cache->store(copy);
    return 0;
}

// OpenSSL fills a certificate's extension cache (its key identifiers, CA and usage flags) the first time a
// verification needs it, and a verification on another thread may read the cache without the lock that
// filled it. The trusted certificates loaded now are shared by every connection's verification, on
// whichever thread the handshake runs: fill their caches here, while the context is still this thread's
// alone. (Certificates OpenSSL loads later from a hashed directory are not covered.)
void warm_trusted_certificates(SSL_CTX* ctx) {
    STACK_OF(X509_OBJECT)* objects = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
    for (int i = 0; i < sk_X509_OBJECT_num(objects); ++i)
        if (X509* x = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objects, i)))
            (void)X509_get_extension_flags(x);
}

}  // namespace

tls_session_cache::~tls_session_cache() {
    if (session_) SSL_SESSION_free(session_);
}

void tls_session_cache::attach(SSL* ssl) {
    SSL_set_ex_data(ssl, cache_index(), this);
    std::lock_guard lock(m_);
    if (session_ && SSL_SESSION_is_resumable(session_)) SSL_set_session(ssl, session_);  // takes its own ref
}

void tls_session_cache::store(SSL_SESSION* s) noexcept {
    SSL_SESSION* old = nullptr;
    {
        std::lock_guard lock(m_);
        old = session_;
        session_ = s;
    }
    if (old) SSL_SESSION_free(old);
}

bool tls_session_resumed(SSL* ssl) {
    return SSL_session_reused(ssl) == 1;
}

result<std::shared_ptr<asio::ssl::context>> make_tls_client_context(const tls_client_options& opts) {
    auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression);
    std::error_code ec;
    if (opts.ca_file.empty()) {
        ctx->set_default_verify_paths(ec);
        if (ec) return error(errc::tls_setup_failed, "system CA store: " + ec.message());
    } else {
        ctx->load_verify_file(opts.ca_file, ec);
        if (ec) return error(errc::tls_setup_failed, "CA file '" + opts.ca_file + "': " + ec.message());
    }
    ctx->set_verify_mode(asio::ssl::verify_peer, ec);
    if (ec) return error(errc::tls_setup_failed, ec.message());
    warm_trusted_certificates(ctx->native_handle());
    // Sessions go to the stream's tls_session_cache (if it has one) through the callback, never to
    // OpenSSL's own context-wide store (which would not know which origin a session belongs to).
    SSL_CTX_set_session_cache_mode(ctx->native_handle(),
                                   SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx->native_handle(), on_new_session);
    return ctx;
}

result<std::shared_ptr<asio::ssl::context>> make_tls_server_context(const tls_server_options& opts) {
    auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression |
                     asio::ssl::context::single_dh_use);
    std::error_code ec;
    ctx->use_certificate_chain_file(opts.cert_file, ec);
    if (ec) return error(errc::tls_setup_failed, "certificate '" + opts.cert_file + "': " + ec.message());
    ctx->use_private_key_file(opts.key_file, asio::ssl::context::pem, ec);
    if (ec) return error(errc::tls_setup_failed, "key '" + opts.key_file + "': " + ec.message());
    return ctx;
}

result<void> prepare_tls_client(SSL* ssl, const std::string& host) {
    if (!is_ip_literal(host)) {
        if (SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)
            return error(errc::tls_setup_failed, "SNI: " + openssl_errors());
        if (SSL_set1_host(ssl, host.c_str()) != 1)
            return error(errc::tls_setup_failed, "host check: " + openssl_errors());
    } else {
        X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
        if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1)
            return error(errc::tls_setup_failed, "IP check: " + openssl_errors());
    }
    SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
    return {};
}

std::string describe_tls_error(SSL* ssl, std::error_code ec) {
    std::string out = ec.message();
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) {
        out += " (certificate: ";
        out += X509_verify_cert_error_string(v);
        out += ")";
    }
    return out;
}

}  // namespace cg::net
