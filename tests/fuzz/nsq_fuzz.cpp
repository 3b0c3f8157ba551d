// libFuzzer target for the sans-io NSQ decoder and the parsers behind it: arbitrary bytes, fed in
// chunks whose sizes come from the input, must never crash, read out of bounds or allocate past the
// frame limit. Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nsq/proto/error_frame.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/proto/lookup.hpp"
#include "nsq/proto/message.hpp"
#include "nsq/proto/server_codec.hpp"

using namespace cg::nsq::proto;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    // First byte: chunk size for feeding (1..256), so partial frames are exercised.
    std::size_t chunk = static_cast<std::size_t>(data[0]) + 1;
    std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
    frame_decoder d(64 * 1024);
    for (std::size_t off = 0; off < in.size(); off += chunk) {
        d.feed(in.substr(off, chunk));
        frame f;
        decode_status st;
        while ((st = d.next(f)) == decode_status::frame) {
            switch (f.type) {
                case frame_type::message: {
                    auto m = parse_message(f.data);
                    if (m) (void)m->body.size();
                    break;
                }
                case frame_type::error:
                    (void)classify_error(f.data);
                    break;
                case frame_type::response:
                    if (!f.data.empty() && f.data.front() == '{') {
                        (void)parse_identify_response(f.data);
                        (void)parse_identify_request(f.data);
                        (void)parse_lookup_response(f.data);
                    }
                    break;
            }
        }
        if (st == decode_status::error) break;
    }
    // The server side's line splitting on the same bytes.
    auto nl = in.find('\n');
    auto params = split_command(in.substr(0, nl));
    for (auto p : params) (void)parse_base10(p);
    return 0;
}
