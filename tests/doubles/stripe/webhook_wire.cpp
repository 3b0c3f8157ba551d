// How fake-stripe's events go on the wire (tests/doubles/stripe/webhooks.hpp): the Stripe-Signature header
// (v1 under every secret, and the v0 test-mode signature receivers must ignore) and the pretty-printed JSON
// Stripe's event bodies have.
#include <cstdint>
#include <string>
#include <vector>

#include "stripe/webhook_signature.hpp"
#include "tests/doubles/stripe/webhooks.hpp"

namespace cg::fake {
namespace {

std::string hex(const stripe::hmac_sha256& h) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(64);
    for (auto b : h) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

}  // namespace

std::string stripe_signature_header(const std::vector<std::string>& secrets, std::int64_t t,
                                    const std::string& body) {
    std::string h = "t=" + std::to_string(t);
    for (const auto& s : secrets)
        if (!s.empty()) h += ",v1=" + hex(stripe::compute_signature(s, t, body));
    // Stripe adds a v0 signature under a fake secret to test-mode events; receivers must ignore it.
    h += ",v0=" + hex(stripe::compute_signature("whsec_fake_stripe_v0_test_mode", t, body));
    return h;
}

std::string pretty_json(const std::string& s) {
    std::string out;
    out.reserve(s.size() * 2);
    int depth = 0;
    bool in_str = false;
    auto newline = [&] {
        out += '\n';
        out.append(static_cast<std::size_t>(depth) * 2, ' ');
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (in_str) {
            out += c;
            if (c == '\\' && i + 1 < s.size()) {
                out += s[++i];
            } else if (c == '"') {
                in_str = false;
            }
            continue;
        }
        switch (c) {
            case '"':
                in_str = true;
                out += c;
                break;
            case '{':
            case '[':
                out += c;
                if (i + 1 < s.size() && (s[i + 1] == '}' || s[i + 1] == ']')) {
                    out += s[++i];
                } else {
                    ++depth;
                    newline();
                }
                break;
            case '}':
            case ']':
                --depth;
                newline();
                out += c;
                break;
            case ',':
                out += c;
                newline();
                break;
            case ':':
                out += ": ";
                break;
            default:
                out += c;
        }
    }
    return out;
}

}  // namespace cg::fake
