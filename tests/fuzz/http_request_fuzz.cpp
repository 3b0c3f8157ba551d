// libFuzzer target for the HTTP/1.1 request parser (what the HTTP server reads from a client): arbitrary
// bytes, pipelined messages included, must never crash or hang; reading them in chunks of any size gives
// the same messages as reading them at once, and an error in both or in neither; a parsed request,
// written back by serialize and parsed again, gives the same request and the same bytes (serialize ∘
// parse is a fixed point). First input byte: the chunk size (1..64). Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>

#include "http_support.hpp"

using namespace fuzz_http;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    std::size_t chunk = (data[0] & 63u) + 1;
    std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<request> parsed;
    auto whole = run<request_parser>(in, in.size() + 1, false, &parsed);
    auto split = run<request_parser, request>(in, chunk, false);
    FUZZ_CHECK(agree(whole, split));
    for (const auto& m : parsed) {
        FUZZ_CHECK(!m.method.empty());
        (void)m.keep_alive();
        auto q = m.query();
        FUZZ_CHECK(m.path().size() + q.size() <= m.target.size());
        (void)query_param(q, "a");
        if (!reserializable(m)) continue;
        std::string wire;
        serialize(m, wire);
        std::vector<request> again;
        auto r = run<request_parser>(wire, wire.size() + 1, false, &again, parse_limits{});
        FUZZ_CHECK(r.size() == 1 && again.size() == 1);
        const auto& a = again.front();
        FUZZ_CHECK(a.method == m.method && a.target == m.target && a.body == m.body &&
                   a.version_minor == m.version_minor);
        std::string wire2;
        serialize(a, wire2);
        FUZZ_CHECK(wire2 == wire);
    }
    return 0;
}
