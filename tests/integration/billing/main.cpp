// The billing pipeline against PostgreSQL and fake-stripe. Skipped (exit 77) without PGHOST.
#define BOOST_TEST_MODULE billing_integration
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
