#include "stripe/form.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::stripe;

BOOST_AUTO_TEST_SUITE(form)

BOOST_AUTO_TEST_CASE(encodes_table) {
    struct row {
        const char* name;
        form_map in;
        const char* out;
    };
    const std::vector<row> rows = {
        {"empty", {}, ""},
        {"scalars", {{"amount", "100"}, {"currency", "usd"}}, "amount=100&currency=usd"},
        {"escapes values",
         {{"description", "Plan A & B = 50%"}},
         "description=Plan%20A%20%26%20B%20%3D%2050%25"},
        {"utf-8", {{"description", "caf\xc3\xa9"}}, "description=caf%C3%A9"},
        {"metadata nesting",
         {{"amount", "100"}, {"metadata", form_map{{"billing_key", "ab12"}, {"customer_id", "c 1"}}}},
         "amount=100&metadata[billing_key]=ab12&metadata[customer_id]=c%201"},
        {"list of scalars",
         {{"expand", form_list{"customer", "invoice"}}},
         "expand[]=customer&expand[]=invoice"},
        {"list of maps",
         {{"items", form_list{form_map{{"price", "p1"}}, form_map{{"price", "p2"}}}}},
         "items[0][price]=p1&items[1][price]=p2"},
        {"deep nesting", {{"a", form_map{{"b", form_map{{"c", "d"}}}}}}, "a[b][c]=d"},
        {"nested key is escaped", {{"metadata", form_map{{"k&=", "v"}}}}, "metadata[k%26%3D]=v"},
        {"empty value", {{"description", ""}}, "description="},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT(r.name) {
            BOOST_TEST(encode_form(r.in) == r.out);
        }
    }
}

BOOST_AUTO_TEST_CASE(decodes_to_flat_pairs) {
    auto d = decode_form(
        "amount=100&metadata[billing_key]=ab12&metadata%5Bx%5D=a+b&description=caf%C3%A9&flag&=v");
    BOOST_TEST_REQUIRE(d.has_value());
    form_pairs want = {{"amount", "100"},      {"metadata[billing_key]", "ab12"},
                       {"metadata[x]", "a b"}, {"description", "caf\xc3\xa9"},
                       {"flag", ""},           {"", "v"}};
    BOOST_TEST_REQUIRE(d->size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        BOOST_TEST((*d)[i].first == want[i].first);
        BOOST_TEST((*d)[i].second == want[i].second);
    }
}

BOOST_AUTO_TEST_CASE(round_trips) {
    form_map in = {{"amount", "4200"},
                   {"metadata", form_map{{"billing_key", "k/1?&="}, {"period", "2024-05"}}}};
    auto d = decode_form(encode_form(in));
    BOOST_TEST_REQUIRE(d.has_value());
    BOOST_TEST_REQUIRE(d->size() == 3u);
    BOOST_TEST((*d)[1].first == "metadata[billing_key]");
    BOOST_TEST((*d)[1].second == "k/1?&=");
}

BOOST_AUTO_TEST_CASE(rejects_bad_escapes) {
    BOOST_TEST(!decode_form("a=%zz").has_value());
    BOOST_TEST(!decode_form("a=%4").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
