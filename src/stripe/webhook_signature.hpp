// Stripe webhook signatures: parses a `Stripe-Signature` header and checks it against the raw request body.
// Pure and sans-io: the caller passes the body exactly as received (before any JSON parsing), the
// configured secrets and the current time, so every case is a unit test without a clock or a socket.
//
// The header is `t=<unix seconds>,v1=<hex HMAC-SHA256>,v1=…,v0=…`: the signed payload is `"<t>.<body>"`;
// Stripe sends one `v1` per active endpoint secret (several during a rotation) and we accept the delivery
// when any `v1` matches the HMAC under any configured secret. Schemes other than `v1` (`v0` is a test-mode
// scheme) are ignored; they never make a delivery valid. Comparisons run in constant time (CRYPTO_memcmp)
// over every `v1`, so the answer time says nothing about how close a forged signature was.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cg::stripe {

// The Stripe SDKs' default: a delivery signed more than five minutes ago is a replay, not a retry (Stripe
// signs each retry afresh).
inline constexpr std::chrono::seconds default_webhook_tolerance{300};
// Bounds on what a header may carry, so a hostile header costs a bounded amount of parsing.
inline constexpr std::size_t max_signature_header_size = 4096;
inline constexpr std::size_t max_v1_signatures = 16;

enum class signature_status {
    ok,
    missing_header,    // no Stripe-Signature header (or an empty one)
    malformed_header,  // not `key=value` pairs, a bad `t`, a `v1` that is not 64 hex digits, too long
    no_timestamp,      // no `t=`
    no_signature,      // no `v1=` (only other schemes, or none)
    no_secret,         // no usable secret configured: a configuration error, never the sender's fault
    mismatch,          // no `v1` matches under any secret: wrong secret, tampered body or a forgery
    stale,             // signature good, but `t` is older than the tolerance
    future,            // signature good, but `t` is further ahead than the tolerance (a clock or a forgery)
};

// The enumerator's name ("ok", "malformed_header", …), for logs.
std::string_view to_string(signature_status s) noexcept;

using hmac_sha256 = std::array<std::uint8_t, 32>;

struct signature_header {
    std::int64_t timestamp = 0;
    std::vector<hmac_sha256> v1;  // decoded; unknown schemes are dropped
};

struct parsed_signature_header {
    signature_status status = signature_status::ok;  // ok, missing_header, malformed_header, no_timestamp,
                                                     // or no_signature
    std::string detail;                              // why it was refused, for logs; empty when ok
    signature_header header;
};

// Parses a header value. Whitespace around items is tolerated; an item without '=', a repeated `t`, a `t`
// that is not a non-negative decimal, or a `v1` that is not 64 hex digits refuses the whole header.
parsed_signature_header parse_signature_header(std::string_view value);

struct signature_verdict {
    signature_status status = signature_status::mismatch;
    std::string detail;          // why it failed, for logs (never a secret or an expected signature)
    std::int64_t timestamp = 0;  // the header's `t` when it parsed
    int secret_index = -1;       // which configured secret matched (0 = current, 1 = previous), when one did
    bool ok() const noexcept { return status == signature_status::ok; }
};

// HMAC-SHA256 of `"<timestamp>.<body>"` under `secret` (what Stripe puts in `v1`).
hmac_sha256 compute_signature(std::string_view secret, std::int64_t timestamp, std::string_view body);

// Checks `header_value` against `body` under each of `secrets` (empty secrets are skipped), then the
// timestamp: a delivery is refused as `stale` when now − t > tolerance and as `future` when t − now >
// tolerance; the edges themselves are accepted. The signature is checked before the time, so an unsigned
// or forged request is reported as `mismatch` whatever its `t`.
signature_verdict verify_signature(std::string_view header_value, std::string_view body,
                                   std::span<const std::string> secrets, std::int64_t now_unix,
                                   std::chrono::seconds tolerance = default_webhook_tolerance);

}  // namespace cg::stripe
