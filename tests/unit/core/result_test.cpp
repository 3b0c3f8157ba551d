#include "core/result.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg;

namespace {
result<int> parse_positive(int v) {
    if (v <= 0) return error(core_errc::out_of_range, "must be > 0");
    return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(value_and_error) {
    auto ok = parse_positive(3);
    BOOST_TEST(ok.has_value());
    BOOST_TEST(*ok == 3);
    auto bad = parse_positive(-1);
    BOOST_TEST(!bad.has_value());
    BOOST_TEST(bad.code() == core_errc::out_of_range);
    BOOST_TEST(bad.err().describe() == "chargeguard.core: out of range; must be > 0");
    BOOST_CHECK_THROW((void)bad.value(), bad_result_access);
}

BOOST_AUTO_TEST_CASE(void_result) {
    result<void> ok;
    BOOST_TEST(ok.has_value());
    result<void> bad = core_errc::parse_error;
    BOOST_TEST(!bad.has_value());
    BOOST_CHECK_THROW(bad.value(), bad_result_access);
}
