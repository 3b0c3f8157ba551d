// The test cluster's control script and data directory (ci/lib.sh exports them: CHARGEGUARD_TEST_PG_CTL is
// ci/pg-cluster, CHARGEGUARD_TEST_PG_DIR its cluster), for tests that stop, start or restart the server.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>

#include "net/tokens.hpp"

namespace cg::test {

struct pg_server_ctl {
    std::string ctl, dir;
    // `purpose` completes the failure message: "… say how to <purpose>".
    explicit pg_server_ctl(const char* purpose) {
        const char* c = std::getenv("CHARGEGUARD_TEST_PG_CTL");
        const char* d = std::getenv("CHARGEGUARD_TEST_PG_DIR");
        BOOST_TEST_REQUIRE(
            (c && d),
            "CHARGEGUARD_TEST_PG_CTL and CHARGEGUARD_TEST_PG_DIR (ci/lib.sh) say how to " << purpose);
        ctl = c;
        dir = d;
    }
    // `what`: stop, start or restart. Waits for pg_ctl: never on the loop (see run_ctl).
    int run(const std::string& what) const {
        return std::system(("\"" + ctl + "\" " + what + " \"" + dir + "\" >/dev/null 2>&1").c_str());
    }
};

// run() as an awaitable, to be spawned on an offload executor (pg_ctl waits; the loop must not).
inline net::awaitable<int> run_ctl(const pg_server_ctl* srv, std::string what) {
    co_return srv->run(what);
}

}  // namespace cg::test
