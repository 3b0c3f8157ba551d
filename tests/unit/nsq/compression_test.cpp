// Stream compression codecs (sans-io): snappy framing and raw deflate with sync flushes, as nsqd 1.3.0
// speaks them. Round trips fed in arbitrary splits, chunking past 64 KiB, corrupt input refused, and
// decompression bounded: no allocation from a declared size, no unbounded output per call.
#include "nsq/proto/compression.hpp"

#include <malloc.h>
#include <snappy.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <string>

#include "nsq/proto/error.hpp"

using namespace cg::nsq::proto;

namespace {

std::string sample(std::size_t n) {
    std::string s;
    for (std::size_t i = 0; s.size() < n; ++i) s += "message " + std::to_string(i % 97) + " body;";
    s.resize(n);
    return s;
}

template <typename Decoder>
std::string feed_in_pieces(Decoder& d, const std::string& wire, std::size_t piece) {
    std::string out;
    for (std::size_t i = 0; i < wire.size(); i += piece) {
        auto r = d.decode(std::string_view(wire).substr(i, piece), out);
        BOOST_REQUIRE(r.has_value());
    }
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_known_vector) {
    BOOST_TEST(crc32c("123456789") == 0xE3069283u);
    BOOST_TEST(crc32c("") == 0u);
}

BOOST_AUTO_TEST_CASE(snappy_stream_starts_with_the_identifier_and_round_trips_in_any_split) {
    snappy_encoder enc;
    std::string wire;
    enc.encode("OK", wire);
    BOOST_TEST(wire.substr(0, 10) == std::string("\xff\x06\x00\x00sNaPpY", 10));
    BOOST_TEST(static_cast<unsigned char>(wire[10]) == 0x01u);  // too short to compress: stored
    auto big = sample(200 * 1024);                              // four chunks of ≤ 64 KiB
    enc.encode(big, wire);
    enc.encode("tail", wire);
    BOOST_TEST(wire.size() < big.size());  // compressible data was compressed
    for (std::size_t piece : {1u, 7u, 4096u, 1u << 20}) {
        snappy_decoder dec;
        BOOST_TEST(feed_in_pieces(dec, wire, piece) == "OK" + big + "tail");
    }
}

BOOST_AUTO_TEST_CASE(snappy_refuses_corruption_and_skips_padding) {
    snappy_encoder enc;
    std::string wire;
    enc.encode("hello nsq", wire);
    {
        auto bad = wire;
        bad[14] ^= 0x01;  // inside the CRC
        snappy_decoder dec;
        std::string out;
        auto r = dec.decode(bad, out);
        BOOST_TEST(!r.has_value());
        BOOST_TEST((r.err().code == cg::nsq::errc::bad_response));
        BOOST_TEST(!dec.decode("x", out).has_value());  // sticky
    }
    {
        snappy_decoder dec;
        std::string out;
        BOOST_TEST(!dec.decode(wire.substr(10), out).has_value());  // no stream identifier
    }
    {
        std::string padded = wire.substr(0, 10) +
                             std::string(
                                 "\xfe\x03\x00\x00"
                                 "abc",
                                 7) +
                             wire.substr(10);
        snappy_decoder dec;
        std::string out;
        BOOST_TEST(dec.decode(padded, out).has_value());
        BOOST_TEST(out == "hello nsq");
    }
    {
        snappy_decoder dec;
        std::string out;
        std::string reserved = wire.substr(0, 10) + std::string("\x02\x01\x00\x00x", 5);
        BOOST_TEST(!dec.decode(reserved, out).has_value());  // reserved unskippable chunk type
    }
}

BOOST_AUTO_TEST_CASE(deflate_each_write_is_flushed_and_round_trips) {
    deflate_encoder enc(6);
    deflate_decoder dec;
    std::string first;
    enc.encode("SUB topic channel\n", first);
    std::string out;
    BOOST_REQUIRE(dec.decode(first, out).has_value());
    BOOST_TEST(out == "SUB topic channel\n");  // decodable on its own: sync flush
    auto big = sample(300 * 1024);
    std::string wire;
    enc.encode(big, wire);
    enc.encode("RDY 10\n", wire);
    BOOST_TEST(wire.size() < big.size() / 4);
    out.clear();
    deflate_decoder dec2;
    std::string both = first + wire;
    BOOST_TEST(feed_in_pieces(dec2, both, 3) == "SUB topic channel\n" + big + "RDY 10\n");
    deflate_decoder bad;
    BOOST_TEST(!bad.decode(std::string("\xff\xff\xff\xff", 4), out).has_value());
}

namespace {

// Bytes the allocator has handed out in mmapped blocks (glibc serves large allocations that way): a
// decoder that sized a buffer from an attacker's header shows up here while it is alive.
std::size_t mmapped_bytes() {
    return ::mallinfo2().hblkhd;
}

std::string varint(std::uint64_t v) {
    std::string s;
    while (v >= 0x80) {
        s.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    s.push_back(static_cast<char>(v));
    return s;
}

std::string snappy_chunk(unsigned char type, const std::string& body) {
    std::string c(1, static_cast<char>(type));
    auto n = body.size();
    c.push_back(static_cast<char>(n & 0xff));
    c.push_back(static_cast<char>((n >> 8) & 0xff));
    c.push_back(static_cast<char>((n >> 16) & 0xff));
    return c + body;
}

const std::string snappy_identifier("\xff\x06\x00\x00sNaPpY", 10);

}  // namespace

// A compressed chunk is a few bytes that may declare up to 4 GiB uncompressed; snappy::Uncompress sizes
// its output from that header before checking anything. The framing format allows 64 KiB per chunk:
// the declaration is refused first, nothing that size is allocated.
BOOST_AUTO_TEST_CASE(snappy_refuses_a_chunk_declaring_more_than_64_kib_before_allocating_it) {
    std::string block = varint(256u << 20) + std::string("\x00\x61", 2);  // "256 MiB", then a literal
    auto wire = snappy_identifier + snappy_chunk(0x00, std::string(4, '\0') + block);
    snappy_decoder dec;
    std::string out;
    auto before = mmapped_bytes();
    auto r = dec.decode(wire, out);
    auto grown = mmapped_bytes() - std::min(before, mmapped_bytes());
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST((r.err().code == cg::nsq::errc::bad_response));
    BOOST_TEST(r.err().message.find("declares 268435456 bytes") != std::string::npos, r.err().message);
    BOOST_TEST(grown < (1u << 20), grown << " bytes allocated for a header's claim");
    BOOST_TEST(out.empty());

    // A valid block over 64 KiB (a conforming writer never makes one) is refused the same way.
    std::string big(100 * 1024, 'x'), compressed;
    snappy::Compress(big.data(), big.size(), &compressed);
    snappy_decoder dec2;
    auto r2 = dec2.decode(snappy_identifier + snappy_chunk(0x00, std::string(4, '\0') + compressed), out);
    BOOST_REQUIRE(!r2.has_value());
    BOOST_TEST(r2.err().message.find("declares 102400 bytes") != std::string::npos, r2.err().message);
}

// A chunk header announcing more than a chunk may hold is refused at once, not buffered up to 16 MiB.
BOOST_AUTO_TEST_CASE(snappy_refuses_an_oversized_chunk_header_without_waiting_for_its_body) {
    snappy_decoder dec;
    std::string out;
    auto r = dec.decode(snappy_identifier + std::string("\x00\xff\xff\xff", 4), out);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(r.err().message.find("chunk of 16777215 bytes") != std::string::npos, r.err().message);
    snappy_decoder dec2;
    BOOST_TEST(!dec2.decode(std::string("\xff\x00\x01\x00", 4), out).has_value());  // identifier of 256
}

// Output per call is bounded: a read of highly compressible chunks comes out over several calls.
BOOST_AUTO_TEST_CASE(snappy_output_per_call_is_bounded_and_the_rest_follows) {
    snappy_encoder enc;
    std::string wire;
    std::string zeros(4u << 20, '\0');
    enc.encode(zeros, wire);
    BOOST_TEST(wire.size() < zeros.size() / 16);
    snappy_decoder dec;
    std::string out, all;
    BOOST_REQUIRE(dec.decode(wire, out, 256 * 1024).has_value());
    BOOST_TEST(out.size() <= 256u * 1024 + 65536);
    BOOST_TEST(dec.pending());
    all += out;
    while (dec.pending()) {
        out.clear();
        BOOST_REQUIRE(dec.decode({}, out, 256 * 1024).has_value());
        BOOST_TEST(out.size() <= 256u * 1024 + 65536);
        all += out;
    }
    BOOST_TEST((all == zeros));
}

// DEFLATE expands up to ~1000:1: 16 MiB of zeros is ~16 KiB on the wire. One call hands out at most
// max_out; the decoder keeps the rest of the input and continues with no new input.
BOOST_AUTO_TEST_CASE(deflate_output_per_call_is_bounded_against_a_bomb) {
    deflate_encoder enc(9);
    std::string wire;
    std::string zeros(16u << 20, '\0');
    enc.encode(zeros, wire);
    BOOST_TEST(wire.size() < 64u * 1024);
    deflate_decoder dec;
    std::string out;
    std::size_t total = 0, calls = 0, largest = 0;
    auto before = mmapped_bytes();
    BOOST_REQUIRE(dec.decode(wire, out, 256 * 1024).has_value());
    for (;;) {
        ++calls;
        largest = std::max(largest, out.size());
        total += out.size();
        BOOST_TEST_REQUIRE(std::all_of(out.begin(), out.end(), [](char c) { return c == 0; }));
        if (!dec.pending()) break;
        out.clear();
        BOOST_REQUIRE(dec.decode({}, out, 256 * 1024).has_value());
    }
    BOOST_TEST(total == zeros.size());
    BOOST_TEST(largest <= 256u * 1024);
    BOOST_TEST(calls >= 64u);
    BOOST_TEST(mmapped_bytes() - std::min(before, mmapped_bytes()) < (2u << 20));

    // New input while output is pending is appended behind what is left, in order.
    deflate_encoder enc2(6);
    std::string a, b;
    enc2.encode(std::string(1u << 20, 'a'), a);
    enc2.encode("tail", b);
    deflate_decoder dec2;
    std::string got;
    BOOST_REQUIRE(dec2.decode(a, got, 4096).has_value());
    BOOST_TEST(dec2.pending());
    BOOST_REQUIRE(dec2.decode(b, got, 4096).has_value());
    while (dec2.pending()) BOOST_REQUIRE(dec2.decode({}, got, 4096).has_value());
    BOOST_TEST((got == std::string(1u << 20, 'a') + "tail"));
}
