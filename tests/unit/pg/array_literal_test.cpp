#include "pg/array_literal.hpp"

#include <boost/test/unit_test.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

using namespace cg::pg;

BOOST_AUTO_TEST_SUITE(array_literal)

BOOST_AUTO_TEST_CASE(text_elements_are_always_quoted_with_quotes_and_backslashes_escaped) {
    std::vector<std::string> v = {"abc", "", "a\"b", "c\\d", "{x,y}", "NULL", " sp ", "é"};
    BOOST_TEST(text_array_literal(v) == R"({"abc","","a\"b","c\\d","{x,y}","NULL"," sp ","é"})");
    BOOST_TEST(text_array_literal(std::vector<std::string>{}) == "{}");
}

BOOST_AUTO_TEST_CASE(an_absent_text_element_is_null_and_an_empty_one_is_not) {
    std::vector<std::optional<std::string>> v = {std::string("a"), std::nullopt, std::string("")};
    BOOST_TEST(text_array_literal(v) == R"({"a",NULL,""})");
    BOOST_TEST(text_array_literal(std::vector<std::optional<std::string>>{std::nullopt}) == "{NULL}");
}

BOOST_AUTO_TEST_CASE(views_give_the_same_literal_as_strings) {
    std::vector<std::string> v = {"abc", "", "a\"b", "c\\d", "\"\"\\", "end\\", "\"start", "NULL", "é"};
    std::vector<std::string_view> views(v.begin(), v.end());
    BOOST_TEST(text_array_literal(views) == text_array_literal(v));
    BOOST_TEST(text_array_literal(views) ==
               R"({"abc","","a\"b","c\\d","\"\"\\","end\\","\"start","NULL","é"})");
    std::vector<std::optional<std::string_view>> o = {std::string_view("a\""), std::nullopt,
                                                      std::string_view()};
    BOOST_TEST(text_array_literal(o) == R"({"a\"",NULL,""})");
    BOOST_TEST(text_array_literal(std::vector<std::string_view>{}) == "{}");
}

BOOST_AUTO_TEST_CASE(integers_in_decimal_and_an_absent_one_is_null) {
    std::vector<std::int64_t> v = {0, 1, -2, 9223372036854775807, -9223372036854775807 - 1};
    BOOST_TEST(int_array_literal(v) == "{0,1,-2,9223372036854775807,-9223372036854775808}");
    std::vector<std::optional<std::int64_t>> o = {std::int64_t{7}, std::nullopt};
    BOOST_TEST(int_array_literal(o) == "{7,NULL}");
    BOOST_TEST(int_array_literal(std::vector<std::int64_t>{}) == "{}");
}

BOOST_AUTO_TEST_SUITE_END()
