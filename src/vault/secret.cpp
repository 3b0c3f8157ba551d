#include "vault/secret.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>

namespace cg::vault {
namespace {

bool lower_hex(std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

result<std::string> random_hex(std::size_t n) {
    bytes b(n);
    if (RAND_bytes(b.data(), static_cast<int>(n)) != 1)
        return error(core_errc::io_error, "OpenSSL RAND_bytes failed: no secure randomness");
    return to_hex(b);
}

}  // namespace

result<issued_secret> issue_secret() {
    auto id = random_hex(id_random_bytes);
    if (!id) return id.err();
    return issue_secret_for(std::move(*id));
}

result<issued_secret> issue_secret_for(std::string id) {
    auto r = random_hex(secret_random_bytes);
    if (!r) return r.err();
    issued_secret s;
    s.secret = std::string(secret_prefix) + id + "_" + *r;
    s.id = std::move(id);
    s.hash = hash_secret(s.secret);
    return s;
}

std::optional<std::string> secret_id(std::string_view secret) {
    if (!secret.starts_with(secret_prefix)) return std::nullopt;
    auto rest = secret.substr(secret_prefix.size());
    auto us = rest.find('_');
    if (us != id_random_bytes * 2) return std::nullopt;
    auto id = rest.substr(0, us), random = rest.substr(us + 1);
    if (random.size() != secret_random_bytes * 2 || !lower_hex(id) || !lower_hex(random)) return std::nullopt;
    return std::string(id);
}

bytes hash_secret(std::string_view secret) {
    // Fetched once: with EVP_sha256() OpenSSL 3 looks the implementation up in its provider store on every
    // call (in the proxy, about half the instructions of hashing a presented key, per request).
    static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA2-256", nullptr);
    bytes out(32);
    unsigned len = 0;
    if (!sha256 || EVP_Digest(secret.data(), secret.size(), out.data(), &len, sha256, nullptr) != 1 ||
        len != 32)
        throw std::runtime_error("SHA-256 failed");  // OpenSSL broken: an invariant, not an outcome
    return out;
}

bool verify_secret(std::string_view secret, std::span<const std::uint8_t> stored) {
    auto h = hash_secret(secret);
    if (stored.size() != h.size()) return false;
    return CRYPTO_memcmp(h.data(), stored.data(), h.size()) == 0;
}

std::string redact_secret(std::string_view secret) {
    if (auto id = secret_id(secret)) return std::string(secret_prefix) + *id + "_…";
    return "(not a vault key)";
}

}  // namespace cg::vault
