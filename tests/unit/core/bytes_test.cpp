#include "core/bytes.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg;

BOOST_AUTO_TEST_CASE(hex_round_trip) {
    bytes b{0x00, 0x01, 0xab, 0xff};
    BOOST_TEST(to_hex(b) == "0001abff");
    auto back = from_hex("0001ABff");
    BOOST_REQUIRE(back.has_value());
    BOOST_TEST(*back == b);
}

BOOST_AUTO_TEST_CASE(hex_rejects_bad_input) {
    BOOST_TEST(!from_hex("abc").has_value());
    BOOST_TEST(!from_hex("zz").has_value());
    BOOST_TEST(from_hex("")->empty());
}

BOOST_AUTO_TEST_CASE(big_endian) {
    std::string out;
    append_be32(out, 0x01020304);
    append_be64(out, 0x0a0b0c0d0e0f1011ULL);
    BOOST_REQUIRE_EQUAL(out.size(), 12u);
    auto* p = reinterpret_cast<const std::uint8_t*>(out.data());
    BOOST_TEST(load_be32(p) == 0x01020304u);
    BOOST_TEST(load_be64(p + 4) == 0x0a0b0c0d0e0f1011ULL);
    BOOST_TEST(load_be16(p) == 0x0102u);
}

BOOST_AUTO_TEST_CASE(case_insensitive) {
    BOOST_TEST(iequals("Content-Length", "content-length"));
    BOOST_TEST(!iequals("Content-Length", "content-lengt"));
}
