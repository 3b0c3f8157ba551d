#include "billing/key.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <stdexcept>

#include "core/bytes.hpp"

namespace cg::billing {

std::string base_key(std::string_view key_namespace, std::string_view customer_id,
                     std::string_view billing_period, std::string_view stripe_account) {
    std::string input;
    input.reserve(key_namespace.size() + customer_id.size() + billing_period.size() + stripe_account.size() +
                  3);
    input.append(key_namespace).append(":").append(customer_id).append(":").append(billing_period);
    if (!stripe_account.empty()) input.append(":").append(stripe_account);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(input.data(), input.size(), digest, &len, EVP_sha256(), nullptr) != 1)
        throw std::runtime_error("sha256 failed");  // broken OpenSSL: nothing sensible to do
    return to_hex(std::span<const std::uint8_t>(digest, len)).substr(0, 32);
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
