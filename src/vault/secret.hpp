// Vault key secrets: `cgvk_<id>_<64 hex>` with 256 bits from OpenSSL's CSPRNG. The id inside the secret
// makes authentication a primary-key lookup (never a scan); only SHA-256 of the whole secret is stored. A
// plain hash is enough: the secret carries 256 bits of entropy, so there is nothing to brute-force that a
// slow hash would protect. Pure apart from the RNG.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/bytes.hpp"
#include "core/result.hpp"

namespace cg::vault {

inline constexpr std::string_view secret_prefix = "cgvk_";
inline constexpr std::size_t secret_random_bytes = 32;  // 256 bits
inline constexpr std::size_t id_random_bytes = 8;       // 16 hex characters

struct issued_secret {
    std::string id;      // 16 lower-case hex characters
    std::string secret;  // cgvk_<id>_<64 lower-case hex>; shown once, never stored
    bytes hash;          // SHA-256 of `secret`
};

// A fresh id and secret. Fails only when OpenSSL's RNG does (RAND_bytes != 1).
result<issued_secret> issue_secret();
// A secret for a given id (tests, and a retry after an id collision).
result<issued_secret> issue_secret_for(std::string id);

// The id inside a presented secret, or nullopt when it is not shaped like one (wrong prefix, id or random
// part of the wrong length or alphabet). Shape only: whether it is genuine is verify()'s job.
std::optional<std::string> secret_id(std::string_view secret);

// SHA-256 of the secret.
bytes hash_secret(std::string_view secret);

// Whether `secret` hashes to `stored`, comparing the digests in constant time (CRYPTO_memcmp), so the
// answer time says nothing about how much of a guess was right.
bool verify_secret(std::string_view secret, std::span<const std::uint8_t> stored);

// "cgvk_<id>_…" for logs: never more of a secret than its public id.
std::string redact_secret(std::string_view secret);

}  // namespace cg::vault
