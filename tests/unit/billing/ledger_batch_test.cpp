#include "billing/ledger_batch.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::billing;

BOOST_AUTO_TEST_CASE(array_literals_quote_every_element_and_escape_quotes_and_backslashes) {
    std::vector<std::string> plain = {"abc", "", "a\"b", "c\\d", "{x,y}", "NULL", " sp "};
    BOOST_TEST(text_array_literal(plain) == R"({"abc","","a\"b","c\\d","{x,y}","NULL"," sp "})");
    std::vector<std::optional<std::string>> opt = {std::string("a"), std::nullopt, std::string("")};
    BOOST_TEST(text_array_literal(opt) == R"({"a",NULL,""})");
    std::vector<std::int64_t> ints = {1, -2, 9223372036854775807};
    BOOST_TEST(int_array_literal(ints) == "{1,-2,9223372036854775807}");
    BOOST_TEST(text_array_literal(std::vector<std::string>{}) == "{}");
    BOOST_TEST(int_array_literal(std::vector<std::int64_t>{}) == "{}");
}
