// PostgreSQL fault tests (a stalled backend or postmaster, the server stopped and started). They act on the
// shared server, so they run alone (meson is_parallel: false). Skipped (exit 77) without PGHOST.
#define BOOST_TEST_MODULE pg_faults
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
