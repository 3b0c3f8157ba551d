#include "billing/machine/key.hpp"

#include <boost/test/unit_test.hpp>

using namespace cg::billing;

BOOST_AUTO_TEST_CASE(base_key_is_sha256_prefix_of_business_fields) {
    // printf 'prod:acme-42:2026-11' | sha256sum | cut -c1-32
    BOOST_TEST(base_key("prod", "acme-42", "2026-11") == "08cee8c08160e33e1a370b75efbf63e5");
    BOOST_TEST(base_key("prod", "acme-42", "2026-12") == "8778083f9f5332471008a56744e1a9b3");
    BOOST_TEST(base_key("prod", "acme-42", "2026-11").size() == 32u);
    BOOST_TEST(base_key("staging", "acme-42", "2026-11") != base_key("prod", "acme-42", "2026-11"));
}

BOOST_AUTO_TEST_CASE(generations) {
    BOOST_TEST(stripe_idempotency_key("abc", 1) == "abc");
    BOOST_TEST(stripe_idempotency_key("abc", 2) == "abc-g2");
    BOOST_TEST(stripe_idempotency_key("abc", 17) == "abc-g17");
}

BOOST_AUTO_TEST_CASE(namespaces) {
    BOOST_TEST(valid_key_namespace("prod"));
    BOOST_TEST(valid_key_namespace("eu-west.billing_v2"));
    BOOST_TEST(!valid_key_namespace(""));
    BOOST_TEST(!valid_key_namespace("a:b"));
    BOOST_TEST(!valid_key_namespace(std::string(65, 'a')));
}
