#include "vault/cap.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::vault;

BOOST_AUTO_TEST_SUITE(cap)

BOOST_AUTO_TEST_CASE(headroom_parses_to_exact_fractions) {
    struct row {
        const char* text;
        std::int64_t num, den;
    };
    for (auto r : {row{"1", 1, 1}, row{"1.1", 11, 10}, row{"1.10", 110, 100}, row{"2.5", 25, 10},
                   row{"0.75", 75, 100}, row{"1.000000001", 1000000001, 1000000000}, row{"100", 100, 1},
                   row{"007.5", 75, 10}, row{"1.", 1, 1}, row{".5", 5, 10}}) {
        auto f = parse_headroom(r.text);
        BOOST_TEST_REQUIRE(f.has_value(), r.text);
        BOOST_TEST(f->num == r.num, r.text);
        BOOST_TEST(f->den == r.den, r.text);
    }
}

BOOST_AUTO_TEST_CASE(headroom_refuses_anything_but_a_plain_positive_decimal) {
    for (const char* bad : {"", ".", "0", "0.0", "-1.1", "+1.1", "1e2", "1.1.1", " 1.1", "1,1", "abc",
                            "1.0000000001", "100.01", "1000", "nan", "inf"})
        BOOST_TEST(!parse_headroom(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(cap_is_the_floor_of_expected_times_headroom_without_float) {
    struct row {
        std::int64_t expected;
        const char* headroom;
        std::int64_t cap;
    };
    // 1.1 as a double is 1.100000000000000088…: 100 × 1.1 in float arithmetic floors to 110 but e.g.
    // 1e15+9 × 1.1 would not. The integer path is exact everywhere.
    for (auto r :
         {row{10000, "1.10", 11000}, row{10000, "1.1", 11000}, row{9, "1.1", 9}, row{10, "1.1", 11},
          row{19, "1.1", 20},      // 20.9 → 20
          row{1999, "1.5", 2998},  // 2998.5 → 2998
          row{0, "1.1", 0}, row{1, "0.5", 0}, row{3, "0.333333333", 0}, row{99999999, "1.1", 109999998},
          row{1'000'000'000'000'009LL, "1.1", 1'100'000'000'000'009LL}, row{7, "1", 7}, row{7, "100", 700}}) {
        auto f = parse_headroom(r.headroom);
        BOOST_TEST_REQUIRE(f.has_value());
        auto c = cap_for(r.expected, *f);
        BOOST_TEST_REQUIRE(c.has_value());
        BOOST_TEST(*c == r.cap, r.expected << " × " << r.headroom);
    }
}

BOOST_AUTO_TEST_CASE(cap_overflow_and_negative_expected_are_errors) {
    BOOST_TEST(!cap_for(INT64_MAX, *parse_headroom("1.5")).has_value());
    BOOST_TEST(!cap_for(-1, *parse_headroom("1.1")).has_value());
    BOOST_TEST(cap_for(INT64_MAX, *parse_headroom("1")).has_value());
}

BOOST_AUTO_TEST_CASE(utilisation_in_basis_points) {
    BOOST_TEST(utilisation_bp(10000, 11000) == 9090);  // the demo's 90.9 %
    BOOST_TEST(format_percent_bp(utilisation_bp(10000, 11000)) == "90.90");
    BOOST_TEST(utilisation_bp(11000, 11000) == 10000);
    BOOST_TEST(utilisation_bp(0, 11000) == 0);
    BOOST_TEST(utilisation_bp(0, 0) == 0);
    BOOST_TEST(utilisation_bp(5, 0) == 10000);
    BOOST_TEST(format_percent_bp(5) == "0.05");
    BOOST_TEST(format_percent_bp(12345) == "123.45");
}

BOOST_AUTO_TEST_SUITE_END()
