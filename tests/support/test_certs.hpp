// The throwaway PKI generated at build time by tests/doubles/stripe/gen-test-certs.sh; meson passes its
// directory in CG_TEST_CERTS.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>

namespace cg::test {

inline std::string cert(const char* name) {
    const char* dir = std::getenv("CG_TEST_CERTS");
    BOOST_TEST_REQUIRE(dir != nullptr, "CG_TEST_CERTS must point at the generated test PKI");
    return std::string(dir) + "/" + name;
}

}  // namespace cg::test
