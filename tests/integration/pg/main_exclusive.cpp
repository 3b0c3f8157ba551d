// PostgreSQL tests that must run alone (meson is_parallel: false): one restarts the shared server, the
// other measures event-loop lag. Skipped (exit 77) without PGHOST, like the other integration tests.
#define BOOST_TEST_MODULE pg_exclusive
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    if (!std::getenv("PGHOST")) {
        std::fprintf(
            stderr,
            "SKIP: PGHOST is not set. These tests need a PostgreSQL server: run ci/test, or start one with "
            "ci/pg-cluster and export PGHOST/PGPORT/PGUSER/PGDATABASE (see ci/lib.sh start_postgres).\n");
        return 77;
    }
    return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
