// PostgreSQL integration tests. They need the server ci/test starts (PGHOST etc. exported by ci/lib.sh);
// without PGHOST the whole executable is skipped (exit 77, which meson counts as skipped).
#define BOOST_TEST_MODULE pg_integration
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
