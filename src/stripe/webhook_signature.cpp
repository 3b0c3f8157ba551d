#include "stripe/webhook_signature.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <charconv>
#include <memory>
#include <stdexcept>

#include "core/bytes.hpp"

namespace cg::stripe {

std::string_view to_string(signature_status s) noexcept {
    switch (s) {
        case signature_status::ok:
            return "ok";
        case signature_status::missing_header:
            return "missing_header";
        case signature_status::malformed_header:
            return "malformed_header";
        case signature_status::no_timestamp:
            return "no_timestamp";
        case signature_status::no_signature:
            return "no_signature";
        case signature_status::no_secret:
            return "no_secret";
        case signature_status::mismatch:
            return "mismatch";
        case signature_status::stale:
            return "stale";
        case signature_status::future:
            return "future";
    }
    return "unknown";
}

namespace {

std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

parsed_signature_header refuse(signature_status status, std::string detail) {
    parsed_signature_header out;
    out.status = status;
    out.detail = std::move(detail);
    return out;
}

// Decimal digits only (no sign, no spaces); at most 18 so the value fits an int64 without overflow checks.
bool parse_unix_seconds(std::string_view s, std::int64_t& out) {
    if (s.empty() || s.size() > 18) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && p == s.data() + s.size();
}

}  // namespace

parsed_signature_header parse_signature_header(std::string_view value) {
    value = trim_ows(value);
    if (value.empty()) return refuse(signature_status::missing_header, "no Stripe-Signature header");
    if (value.size() > max_signature_header_size)
        return refuse(signature_status::malformed_header, "Stripe-Signature header too long");

    parsed_signature_header out;
    bool have_t = false;
    while (!value.empty()) {
        auto comma = value.find(',');
        auto item = trim_ows(value.substr(0, comma));
        value = comma == std::string_view::npos ? std::string_view{} : value.substr(comma + 1);
        auto eq = item.find('=');
        if (eq == std::string_view::npos || eq == 0)
            return refuse(signature_status::malformed_header, "item without key=value");
        auto key = item.substr(0, eq);
        auto val = item.substr(eq + 1);
        if (key == "t") {
            if (have_t) return refuse(signature_status::malformed_header, "repeated t");
            if (!parse_unix_seconds(val, out.header.timestamp))
                return refuse(signature_status::malformed_header, "t is not a unix time");
            have_t = true;
        } else if (key == "v1") {
            auto raw = val.size() == 64 ? from_hex(val) : std::nullopt;
            if (!raw) return refuse(signature_status::malformed_header, "v1 is not 64 hex digits");
            if (out.header.v1.size() == max_v1_signatures)
                return refuse(signature_status::malformed_header, "too many v1 signatures");
            hmac_sha256 sig;
            std::copy(raw->begin(), raw->end(), sig.begin());
            out.header.v1.push_back(sig);
        }
        // Other schemes (v0, future ones) are ignored: they never make a delivery valid.
    }
    if (!have_t) return refuse(signature_status::no_timestamp, "no t in Stripe-Signature");
    if (out.header.v1.empty()) return refuse(signature_status::no_signature, "no v1 in Stripe-Signature");
    return out;
}

hmac_sha256 compute_signature(std::string_view secret, std::int64_t timestamp, std::string_view body) {
    // Fetched once: OpenSSL 3 otherwise looks the implementation up in its provider store on every call.
    static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (!hmac) throw std::runtime_error("OpenSSL has no HMAC implementation");
    std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmac), &EVP_MAC_CTX_free);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    auto t = std::to_string(timestamp);
    hmac_sha256 out{};
    std::size_t len = 0;
    auto* key = reinterpret_cast<const unsigned char*>(secret.data());
    auto update = [&](std::string_view s) {
        return EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(s.data()), s.size()) == 1;
    };
    if (!ctx || EVP_MAC_init(ctx.get(), key, secret.size(), params) != 1 || !update(t) || !update(".") ||
        !update(body) || EVP_MAC_final(ctx.get(), out.data(), &len, out.size()) != 1 || len != out.size())
        throw std::runtime_error("HMAC-SHA256 failed");
    return out;
}

signature_verdict verify_signature(std::string_view header_value, std::string_view body,
                                   std::span<const std::string> secrets, std::int64_t now_unix,
                                   std::chrono::seconds tolerance) {
    signature_verdict v;
    auto parsed = parse_signature_header(header_value);
    if (parsed.status != signature_status::ok) {
        v.status = parsed.status;
        v.detail = std::move(parsed.detail);
        return v;
    }
    v.timestamp = parsed.header.timestamp;

    // Every secret and every v1 is compared, whatever matched earlier, so the time taken depends only on
    // how many there are, never on which one (or how much of one) matched.
    bool any_secret = false;
    for (std::size_t i = 0; i < secrets.size(); ++i) {
        if (secrets[i].empty()) continue;
        any_secret = true;
        auto expected = compute_signature(secrets[i], v.timestamp, body);
        for (const auto& sig : parsed.header.v1)
            if (CRYPTO_memcmp(expected.data(), sig.data(), expected.size()) == 0 && v.secret_index < 0)
                v.secret_index = static_cast<int>(i);
    }
    if (!any_secret) {
        v.status = signature_status::no_secret;
        v.detail = "no webhook secret configured";
        return v;
    }
    if (v.secret_index < 0) {
        v.status = signature_status::mismatch;
        v.detail = "no v1 signature matches";
        return v;
    }
    const std::int64_t tol = tolerance.count();
    if (now_unix - v.timestamp > tol) {
        v.status = signature_status::stale;
        v.detail = "signed " + std::to_string(now_unix - v.timestamp) + " s ago";
    } else if (v.timestamp - now_unix > tol) {
        v.status = signature_status::future;
        v.detail = "signed " + std::to_string(v.timestamp - now_unix) + " s in the future";
    } else {
        v.status = signature_status::ok;
    }
    return v;
}

}  // namespace cg::stripe
