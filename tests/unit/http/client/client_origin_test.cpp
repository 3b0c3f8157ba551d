#include <boost/test/unit_test.hpp>

#include "http/origin.hpp"

using cg::http::parse_origin;

BOOST_AUTO_TEST_SUITE(origin)

BOOST_AUTO_TEST_CASE(parses_scheme_host_port) {
    struct row {
        const char* url;
        bool tls;
        const char* host;
        unsigned port;
        const char* host_header;
    };
    const row rows[] = {
        {"https://api.stripe.com", true, "api.stripe.com", 443, "api.stripe.com"},
        {"https://api.stripe.com/", true, "api.stripe.com", 443, "api.stripe.com"},
        {"http://127.0.0.1:8080", false, "127.0.0.1", 8080, "127.0.0.1:8080"},
        {"http://example.org", false, "example.org", 80, "example.org"},
        {"https://[::1]:8443", true, "::1", 8443, "[::1]:8443"},
        {"https://localhost:443", true, "localhost", 443, "localhost"},
    };
    for (const auto& r : rows) {
        BOOST_TEST_CONTEXT(r.url) {
            auto o = parse_origin(r.url);
            BOOST_TEST_REQUIRE(o.has_value());
            BOOST_TEST(o->tls == r.tls);
            BOOST_TEST(o->host == r.host);
            BOOST_TEST(o->port == r.port);
            BOOST_TEST(o->host_header() == r.host_header);
        }
    }
}

BOOST_AUTO_TEST_CASE(rejects_bad_urls) {
    for (const char* bad : {"ftp://x", "api.stripe.com", "https://", "https://h:0", "https://h:99999",
                            "https://h:12x", "https://h/v1", "https://[::1", "https://h:"}) {
        BOOST_TEST_CONTEXT(bad) {
            BOOST_TEST(!parse_origin(bad).has_value());
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
