// main() for test executables that need the PostgreSQL server ci/test starts. Include it from exactly one
// file of the executable, after `#define BOOST_TEST_MODULE …` and `#define BOOST_TEST_NO_MAIN`. Without
// PGHOST the whole executable is skipped (exit 77, which meson counts as skipped) with a clear message.
#pragma once

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
