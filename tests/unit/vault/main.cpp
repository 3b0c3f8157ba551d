#define BOOST_TEST_MODULE vault
#include <boost/test/unit_test.hpp>
