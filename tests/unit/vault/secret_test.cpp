#include "vault/secret.hpp"

#include <boost/test/unit_test.hpp>
#include <set>
#include <vector>

using namespace cg::vault;

BOOST_AUTO_TEST_SUITE(secret)

BOOST_AUTO_TEST_CASE(issued_secret_has_the_id_inside_and_256_random_bits) {
    auto s = issue_secret();
    BOOST_TEST_REQUIRE(s.has_value());
    BOOST_TEST(s->id.size() == 16u);
    BOOST_TEST(s->secret.starts_with("cgvk_" + s->id + "_"));
    BOOST_TEST(s->secret.size() == 5u + 16u + 1u + 64u);  // 64 hex = 32 bytes = 256 bits
    BOOST_TEST(secret_id(s->secret).value_or("") == s->id);
    BOOST_TEST(s->hash.size() == 32u);
    BOOST_TEST(s->hash == hash_secret(s->secret));
}

BOOST_AUTO_TEST_CASE(secrets_do_not_repeat) {
    std::set<std::string> seen;
    for (int i = 0; i < 200; ++i) seen.insert(issue_secret()->secret);
    BOOST_TEST(seen.size() == 200u);
}

BOOST_AUTO_TEST_CASE(verify_accepts_only_the_exact_secret) {
    auto s = *issue_secret();
    BOOST_TEST(verify_secret(s.secret, s.hash));
    std::string flipped = s.secret;
    flipped.back() = flipped.back() == '0' ? '1' : '0';
    BOOST_TEST(!verify_secret(flipped, s.hash));
    BOOST_TEST(!verify_secret(s.secret + "x", s.hash));
    BOOST_TEST(!verify_secret(s.secret, cg::bytes(31, 0)));  // a truncated stored hash never matches
    BOOST_TEST(!verify_secret("", s.hash));
}

BOOST_AUTO_TEST_CASE(secret_id_refuses_malformed_secrets) {
    std::string id(16, 'a'), random(64, 'b');
    BOOST_TEST(secret_id("cgvk_" + id + "_" + random).value_or("") == id);
    for (const std::string& bad :
         std::vector<std::string>{"", "sk_test_123", "cgvk_", "cgvk_" + id, "cgvk_" + id + "_",
                                  "cgvk_" + id + "_" + random + "0", "cgvk_" + id.substr(1) + "_" + random,
                                  "cgvk_" + std::string(16, 'A') + "_" + random, "CGVK_" + id + "_" + random,
                                  "cgvk_" + id + "_" + std::string(64, 'g'), "cgvk_" + id + "-" + random})
        BOOST_TEST(!secret_id(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(redaction_keeps_only_the_public_id) {
    auto s = *issue_secret();
    auto r = redact_secret(s.secret);
    BOOST_TEST(r.find(s.id) != std::string::npos);
    BOOST_TEST(r.find(s.secret.substr(22)) == std::string::npos);
    BOOST_TEST(redact_secret("sk_live_abcdef") == "(not a vault key)");
}

BOOST_AUTO_TEST_SUITE_END()
