// Stream compression codecs (sans-io): snappy framing and raw deflate with sync flushes, as nsqd 1.3.0
// speaks them. Round trips fed in arbitrary splits, chunking past 64 KiB, and corrupt input refused.
#include "nsq/proto/compression.hpp"

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
