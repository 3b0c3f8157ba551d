#include "core/enum_names.hpp"

#include <boost/test/unit_test.hpp>

namespace {
enum class colour { red, green, blue, unnamed };
constexpr cg::enum_names<colour, 3> colour_names({{
    {colour::red, "red"},
    {colour::green, "green"},
    {colour::blue, "blue"},
}});
static_assert(colour_names.name(colour::green) == "green");
static_assert(colour_names.parse("blue") == colour::blue);
}  // namespace

BOOST_AUTO_TEST_SUITE(enum_names)

BOOST_AUTO_TEST_CASE(every_name_parses_back_to_its_value) {
    for (const auto& [value, name] : colour_names.entries()) {
        BOOST_TEST(colour_names.name(value) == name);
        BOOST_TEST((colour_names.parse(name) == value));
    }
}

BOOST_AUTO_TEST_CASE(unknown_values_and_names) {
    BOOST_TEST(colour_names.name(colour::unnamed) == "?");
    BOOST_TEST(colour_names.name(colour::unnamed, "none") == "none");
    BOOST_TEST(!colour_names.parse("Red").has_value());  // exact: no case folding
    BOOST_TEST(!colour_names.parse("").has_value());
    BOOST_TEST(!colour_names.parse("re").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
