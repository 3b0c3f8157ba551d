// libFuzzer target for the HTTP/1.1 response parser (what the HTTP client reads from Stripe or the vault
// proxy): arbitrary bytes must never crash or hang; reading them in chunks of any size gives the same
// responses as reading them at once (a body read until the peer closes included), and an error in both
// or in neither; a parsed response, written back by serialize and parsed again, gives the same status,
// body and bytes. First input byte: the chunk size (1..64, low six bits) and whether the request was
// HEAD (bit 6). Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>

#include "http_support.hpp"

using namespace fuzz_http;

namespace {
bool bodyless(int status) {
    return status == 204 || status == 304 || (status >= 100 && status < 200);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    std::size_t chunk = (data[0] & 63u) + 1;
    bool head = (data[0] & 64u) != 0;
    std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<response> parsed;
    auto whole = run<response_parser>(in, in.size() + 1, head, &parsed);
    auto split = run<response_parser, response>(in, chunk, head);
    FUZZ_CHECK(agree(whole, split));
    for (const auto& m : parsed) {
        FUZZ_CHECK(m.status >= 100 && m.status <= 999);
        if (head) FUZZ_CHECK(m.body.empty());
        (void)m.keep_alive();
        if (!reserializable(m) || bodyless(m.status) || head) continue;
        std::string wire;
        serialize(m, wire);
        std::vector<response> again;
        auto r = run<response_parser>(wire, wire.size() + 1, false, &again, parse_limits{});
        FUZZ_CHECK(r.size() == 1 && again.size() == 1);
        const auto& a = again.front();
        FUZZ_CHECK(a.status == m.status && a.body == m.body && a.version_minor == m.version_minor);
        std::string wire2;
        serialize(a, wire2);
        FUZZ_CHECK(wire2 == wire);
    }
    return 0;
}
