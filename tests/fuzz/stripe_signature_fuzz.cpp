// libFuzzer target for the Stripe-Signature header parser and verifier: arbitrary header bytes must never
// crash or read out of bounds; a header that parses has a non-negative `t` and at most max_v1_signatures
// signatures, and verifying it against a body never accepts a signature nobody computed. Built and run
// by ci/fuzz.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/bytes.hpp"
#include "stripe/webhook_signature.hpp"

using namespace cg::stripe;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view header(reinterpret_cast<const char*>(data), size);
    auto p = parse_signature_header(header);
    if (p.status == signature_status::ok) {
        if (p.header.timestamp < 0 || p.header.v1.empty() || p.header.v1.size() > max_v1_signatures)
            std::abort();
    } else if (p.detail.empty()) {
        std::abort();
    }
    const std::string secrets[] = {"whsec_fuzz"};
    auto v = verify_signature(header, "{}", secrets, 1700000000);
    // Accepting needs the HMAC under the secret: the fuzzer cannot guess 256 bits, so an "ok" is a bug.
    if (v.ok()) std::abort();
    // The header with a correct v1 appended (when it still parses) must verify within the tolerance.
    if (p.status == signature_status::ok && p.header.v1.size() < max_v1_signatures &&
        header.size() + 70 <= max_signature_header_size) {
        std::string good(header);
        good += ",v1=" + cg::to_hex(compute_signature("whsec_fuzz", p.header.timestamp, "{}"));
        auto g = verify_signature(good, "{}", secrets, p.header.timestamp);
        if (parse_signature_header(good).status == signature_status::ok && !g.ok()) std::abort();
    }
    return 0;
}
