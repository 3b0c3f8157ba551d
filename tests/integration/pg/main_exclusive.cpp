// PostgreSQL tests that must run alone (meson is_parallel: false): one restarts the shared server, the
// other measures event-loop lag. Skipped (exit 77) without PGHOST, like the other integration tests.
#define BOOST_TEST_MODULE pg_exclusive
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
