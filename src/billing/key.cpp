#include "billing/key.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace cg::billing {

namespace {

// SHA-256 of `input`. The implementation is fetched once (with EVP_sha256() OpenSSL 3 looks it up in its
// provider store on every call) and each thread keeps one digest context, reinitialised per key rather
// than allocated: a key is computed for every delivery.
void sha256(std::string_view input, unsigned char (&digest)[EVP_MAX_MD_SIZE], unsigned int& len) {
    static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA2-256", nullptr);
    struct ctx_deleter {
        void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
    };
    thread_local std::unique_ptr<EVP_MD_CTX, ctx_deleter> ctx(EVP_MD_CTX_new());
    if (!md || !ctx || EVP_DigestInit_ex2(ctx.get(), md, nullptr) != 1 ||
        EVP_DigestUpdate(ctx.get(), input.data(), input.size()) != 1 ||
        EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len < 16)
        throw std::runtime_error("sha256 failed");  // broken OpenSSL: nothing sensible to do
}

}  // namespace

std::string base_key(std::string_view key_namespace, std::string_view customer_id,
                     std::string_view billing_period, std::string_view stripe_account) {
    // Hashed from a stack buffer when the parts fit (they nearly always do), else from a string.
    char buf[512];
    std::string big;
    std::size_t size = key_namespace.size() + customer_id.size() + billing_period.size() + 2 +
                       (stripe_account.empty() ? 0 : stripe_account.size() + 1);
    char* out = buf;
    if (size > sizeof buf) {
        big.resize(size);
        out = big.data();
    }
    char* p = out;
    auto put = [&p](std::string_view s) { p = std::copy(s.begin(), s.end(), p); };
    put(key_namespace);
    put(":");
    put(customer_id);
    put(":");
    put(billing_period);
    if (!stripe_account.empty()) {
        put(":");
        put(stripe_account);
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    sha256(std::string_view(out, size), digest, len);
    // The first 16 bytes, as 32 lower-case hex digits.
    static constexpr char digits[] = "0123456789abcdef";
    std::string key(32, '\0');
    for (std::size_t i = 0; i < 16; ++i) {
        key[2 * i] = digits[digest[i] >> 4];
        key[2 * i + 1] = digits[digest[i] & 0xf];
    }
    return key;
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
