#include "billing/machine/key.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <stdexcept>

#include "core/bytes.hpp"

namespace cg::billing {

namespace {

// SHA-256 of `parts` one after another. The implementation is fetched once (with EVP_sha256() OpenSSL 3
// looks it up in its provider store on every call) and each thread keeps one digest context, reinitialised
// per key rather than allocated: a key is computed for every delivery.
void sha256(std::initializer_list<std::string_view> parts, unsigned char (&digest)[EVP_MAX_MD_SIZE],
            unsigned int& len) {
    static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA2-256", nullptr);
    struct ctx_deleter {
        void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
    };
    thread_local std::unique_ptr<EVP_MD_CTX, ctx_deleter> ctx(EVP_MD_CTX_new());
    bool ok = md && ctx && EVP_DigestInit_ex2(ctx.get(), md, nullptr) == 1;
    for (auto part : parts) ok = ok && EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1;
    if (!ok || EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len < 16)
        throw std::runtime_error("sha256 failed");  // broken OpenSSL: nothing sensible to do
}

}  // namespace

std::string base_key(std::string_view key_namespace, std::string_view customer_id,
                     std::string_view billing_period, std::string_view stripe_account) {
    // The parts are hashed in place, with no joined copy of them.
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (stripe_account.empty())
        sha256({key_namespace, ":", customer_id, ":", billing_period}, digest, len);
    else
        sha256({key_namespace, ":", customer_id, ":", billing_period, ":", stripe_account}, digest, len);
    return to_hex(std::span<const std::uint8_t>(digest, 16));  // 32 lower-case hex digits
}

std::string stripe_idempotency_key(std::string_view base, std::int32_t generation) {
    if (generation <= 1) return std::string(base);
    return std::string(base) + "-g" + std::to_string(generation);
}

bool valid_key_namespace(std::string_view ns) {
    return !ns.empty() && ns.size() <= 64 && std::all_of(ns.begin(), ns.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '.' || c == '-';
    });
}

}  // namespace cg::billing
