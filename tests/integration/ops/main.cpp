#define BOOST_TEST_MODULE ops_e2e
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
