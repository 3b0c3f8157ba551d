#define BOOST_TEST_MODULE vault_integration
#define BOOST_TEST_NO_MAIN
#include "support/pg_main.hpp"
