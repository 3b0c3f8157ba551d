#include "stripe/webhook_signature.hpp"

#include <boost/test/unit_test.hpp>

#include "core/bytes.hpp"

using namespace cg::stripe;
using namespace std::chrono_literals;

namespace {

// Vectors computed independently of OpenSSL (Python's hmac module):
//   hmac.new(secret, b"1700000000." + body, hashlib.sha256).hexdigest()
constexpr std::string_view vector_body = R"({"id":"evt_1","object":"event"})";
constexpr std::int64_t vector_t = 1700000000;
constexpr std::string_view current_sig = "0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd";
constexpr std::string_view previous_sig = "4f42c9259cd00d185e71bdfef20ed5c7df09179107f366ba709d2f39d5d8f068";
const std::string current_secret = "whsec_test_secret";
const std::string previous_secret = "whsec_previous";

std::string header_for(std::string_view v1, std::int64_t t = vector_t) {
    return "t=" + std::to_string(t) + ",v1=" + std::string(v1);
}

signature_verdict check(std::string_view header, std::string_view body = vector_body,
                        std::int64_t now = vector_t, std::chrono::seconds tol = default_webhook_tolerance) {
    const std::string secrets[] = {current_secret};
    return verify_signature(header, body, secrets, now, tol);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(webhook_signature)

BOOST_AUTO_TEST_CASE(computes_the_independent_vectors) {
    BOOST_TEST(cg::to_hex(compute_signature(current_secret, vector_t, vector_body)) == current_sig);
    BOOST_TEST(cg::to_hex(compute_signature(previous_secret, vector_t, vector_body)) == previous_sig);
}

BOOST_AUTO_TEST_CASE(accepts_a_good_signature) {
    auto v = check(header_for(current_sig));
    BOOST_TEST(v.ok(), v.detail);
    BOOST_TEST(v.timestamp == vector_t);
    BOOST_TEST(v.secret_index == 0);
}

BOOST_AUTO_TEST_CASE(upper_case_hex_and_spaces_are_accepted) {
    std::string upper(current_sig);
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    BOOST_TEST(check(" t=1700000000 , v1=" + upper + " ").ok());
}

BOOST_AUTO_TEST_CASE(rotation_accepts_either_secret) {
    const std::string both[] = {current_secret, previous_secret};
    auto v = verify_signature(header_for(previous_sig), vector_body, both, vector_t);
    BOOST_TEST(v.ok(), v.detail);
    BOOST_TEST(v.secret_index == 1);
    v = verify_signature(header_for(current_sig), vector_body, both, vector_t);
    BOOST_TEST(v.secret_index == 0);
    // Only the current secret configured: a delivery signed under the previous one alone is refused.
    BOOST_TEST(to_string(check(header_for(previous_sig)).status) == "mismatch");
}

BOOST_AUTO_TEST_CASE(several_v1_with_one_good) {
    const std::string bad(64, 'a');
    for (const auto& h : {"t=1700000000,v1=" + bad + ",v1=" + std::string(current_sig),
                          "t=1700000000,v1=" + std::string(current_sig) + ",v1=" + bad,
                          "v1=" + bad + ",v0=" + bad + ",v1=" + std::string(current_sig) + ",t=1700000000"}) {
        BOOST_TEST_CONTEXT(h) {
            BOOST_TEST(check(h).ok(), check(h).detail);
        }
    }
    BOOST_TEST(to_string(check("t=1700000000,v1=" + bad + ",v1=" + bad).status) == "mismatch");
}

BOOST_AUTO_TEST_CASE(tampered_body_or_timestamp_is_refused) {
    BOOST_TEST(to_string(check(header_for(current_sig), R"({"id":"evt_2","object":"event"})").status) ==
               "mismatch");
    BOOST_TEST(to_string(check(header_for(current_sig), std::string(vector_body) + " ").status) ==
               "mismatch");
    // The timestamp is signed too: moving it invalidates the signature.
    BOOST_TEST(to_string(check(header_for(current_sig, vector_t + 1), vector_body, vector_t).status) ==
               "mismatch");
    // One flipped bit of the signature.
    std::string flipped(current_sig);
    flipped[63] = flipped[63] == 'd' ? 'c' : 'd';
    BOOST_TEST(to_string(check(header_for(flipped)).status) == "mismatch");
}

BOOST_AUTO_TEST_CASE(only_other_schemes_is_no_signature) {
    // v0 carries a valid-looking HMAC, but only v1 counts.
    auto v = check("t=1700000000,v0=" + std::string(current_sig));
    BOOST_TEST(to_string(v.status) == "no_signature");
    BOOST_TEST(!v.detail.empty());
}

BOOST_AUTO_TEST_CASE(tolerance_edges) {
    const auto h = header_for(current_sig);
    BOOST_TEST(check(h, vector_body, vector_t + 300).ok());                           // exactly 300 s old
    BOOST_TEST(to_string(check(h, vector_body, vector_t + 301).status) == "stale");   // one second more
    BOOST_TEST(check(h, vector_body, vector_t - 300).ok());                           // 300 s ahead
    BOOST_TEST(to_string(check(h, vector_body, vector_t - 301).status) == "future");  // clock or forgery
    BOOST_TEST(check(h, vector_body, vector_t + 10, 10s).ok());                       // a tighter flag
    BOOST_TEST(to_string(check(h, vector_body, vector_t + 11, 10s).status) == "stale");
    auto v = check(h, vector_body, vector_t + 86400);
    BOOST_TEST(v.secret_index == 0);  // the signature itself was good: it is stale, not forged
    BOOST_TEST(!v.detail.empty());
}

BOOST_AUTO_TEST_CASE(forged_and_stale_reports_the_forgery) {
    BOOST_TEST(to_string(check(header_for(std::string(64, 'b')), vector_body, vector_t + 86400).status) ==
               "mismatch");
}

BOOST_AUTO_TEST_CASE(no_secret_configured) {
    const std::string none[] = {std::string{}};
    auto v = verify_signature(header_for(current_sig), vector_body, none, vector_t);
    BOOST_TEST(to_string(v.status) == "no_secret");
    v = verify_signature(header_for(current_sig), vector_body, std::span<const std::string>{}, vector_t);
    BOOST_TEST(to_string(v.status) == "no_secret");
}

BOOST_AUTO_TEST_CASE(malformed_headers_are_refused_with_a_reason) {
    const std::string good(current_sig);
    struct row {
        std::string header;
        std::string_view want;
    };
    const row rows[] = {
        {"", "missing_header"},
        {"   ", "missing_header"},
        {"v1=" + good, "no_timestamp"},
        {"t=1700000000", "no_signature"},
        {"t=1700000000,v1=", "malformed_header"},
        {"t=1700000000,v1=" + good.substr(0, 62), "malformed_header"},  // short
        {"t=1700000000,v1=" + good + "00", "malformed_header"},         // long
        {"t=1700000000,v1=" + good.substr(0, 63) + "g", "malformed_header"},
        {"t=,v1=" + good, "malformed_header"},
        {"t=-1700000000,v1=" + good, "malformed_header"},
        {"t=+1700000000,v1=" + good, "malformed_header"},
        {"t=17e8,v1=" + good, "malformed_header"},
        {"t=1700000000000000000000,v1=" + good, "malformed_header"},
        {"t=1700000000,t=1700000000,v1=" + good, "malformed_header"},
        {"t=1700000000,garbage,v1=" + good, "malformed_header"},
        {"t=1700000000,=x,v1=" + good, "malformed_header"},
        {"t=1700000000,v1=" + good + "," + std::string(5000, 'x') + "=1", "malformed_header"},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT("header '" << r.header.substr(0, 100) << "'") {
            auto v = check(r.header);
            BOOST_TEST(to_string(v.status) == r.want);
            BOOST_TEST(!v.detail.empty());
            BOOST_TEST(v.secret_index == -1);
        }
    }
}

BOOST_AUTO_TEST_CASE(too_many_signatures_are_refused) {
    std::string h = "t=1700000000";
    for (std::size_t i = 0; i < max_v1_signatures; ++i) h += ",v1=" + std::string(64, 'a');
    BOOST_TEST(to_string(check(h).status) == "mismatch");  // at the bound: parsed, none matches
    h += ",v1=" + std::string(current_sig);
    BOOST_TEST(to_string(check(h).status) == "malformed_header");
}

BOOST_AUTO_TEST_SUITE_END()
