// PostgreSQL integration tests. They need the server ci/test starts (PGHOST etc. exported by ci/lib.sh);
// without PGHOST the whole executable is skipped (exit 77, which meson counts as skipped).
#define BOOST_TEST_MODULE pg_integration
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
